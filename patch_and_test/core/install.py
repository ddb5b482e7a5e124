"""Build a DeepSpeed source tree into a wheel, cached by (git tree id, interpreter, torch), and install it here; the
build runs without isolation (setup.py imports torch) and with DS_BUILD_OPS=0 (ops are JIT-built at run time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.errors import CommandParser, PipelineError
from patch_and_test.core.gitrun import git, git_out
from repro.harness.env import cache_root, dist_version


@dataclasses.dataclass(frozen=True)
class Installed:
    version: str  # importlib.metadata version after the install
    cached_wheel: bool
    installer: str


def install_tree(tree: Path, log: Path, rev: str = "HEAD") -> Installed:
    """Install commit ``rev`` of ``tree`` into this interpreter (replacing any DeepSpeed)."""
    tid = git_out(tree, "rev-parse", f"{rev}^{{tree}}").strip()
    if (torch := dist_version("torch")) is None:
        raise PipelineError(
            "torch is not installed in this environment: install it first (its CPU build: README, 'Two commands')")
    key = hashlib.sha256("|".join([tid, sys.version, torch]).encode()).hexdigest()[:16]
    wheel_dir = cache_root() / "wheels" / key
    wheels = sorted(wheel_dir.glob("deepspeed-*.whl")) if wheel_dir.is_dir() else []
    cached = bool(wheels)
    installer = Installer.find()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        if not cached:
            wheels = [_build_wheel(tree, rev, wheel_dir, installer, out)]
        _run(installer.install_cmd(wheels[0]), out)
        # Without bytecode (PYTHONDONTWRITEBYTECODE in CI images; uv does not compile) every rank re-parses DeepSpeed.
        deepspeed = Path(sysconfig.get_paths()["purelib"]) / "deepspeed"
        _run([sys.executable, "-m", "compileall", "-q", "-j0", str(deepspeed)], out)
        env = dict(os.environ, MAX_JOBS="2",
                   PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
        _run([sys.executable, "-c", _PREBUILD], out, env=env, cwd=PACKAGE_ROOT)  # its two sources side by side
    return Installed(importlib.metadata.version("deepspeed"), cached, installer.kind)


# The ranks' CPU comm op, built once here, not inside a launch's deadline (a reinstall makes ninja rebuild it).
_PREBUILD = """
import os
from repro.harness.env import torch_extensions_dir
folder = torch_extensions_dir()
# A killed build's lock stays forever and every later build waits on it; nothing else builds here now.
(folder / "deepspeed_shm_comm" / "lock").unlink(missing_ok=True)
os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
os.environ["DS_ACCELERATOR"] = "cpu"
from deepspeed.comm.torch import build_shm_op
build_shm_op()
"""


def _build_wheel(tree: Path, rev: str, wheel_dir: Path, installer: Installer, out) -> Path:
    tmp = wheel_dir.with_name(wheel_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # Build from a clean export of the commit, not the work tree: what is cached is exactly that commit.
    export = tmp / "src"
    export.mkdir(parents=True)
    archive = git(tree, "archive", "--format=tar", rev, text=False).stdout
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive, check=True)
    _run(installer.wheel_cmd(export, tmp), out, env={**os.environ, "DS_BUILD_OPS": "0"}, cwd=export)
    built = sorted(tmp.glob("deepspeed-*.whl"))
    if not built:
        raise PipelineError(f"building {tree} produced no deepspeed wheel (see {out.name})")
    wheel_dir.mkdir(parents=True, exist_ok=True)
    final = wheel_dir / built[0].name
    built[0].replace(final)
    shutil.rmtree(tmp, ignore_errors=True)
    return final


@dataclasses.dataclass(frozen=True)
class Installer:
    """uv when there is one (an order of magnitude faster), else this interpreter's pip."""

    kind: str  # "uv" | "pip"
    argv: tuple[str, ...]

    @classmethod
    def find(cls) -> Installer:
        uv = shutil.which("uv")
        if uv is None:
            try:
                import uv as uv_module  # the PyPI package ships the binary

                uv = uv_module.find_uv_bin()
            except (ImportError, FileNotFoundError):
                uv = None
        return cls("uv", (uv, )) if uv else cls("pip", (sys.executable, "-m", "pip"))

    def install_cmd(self, wheel: Path) -> list[str]:
        if self.kind == "uv":
            return [*self.argv, "pip", "install", "--python", sys.executable, "--no-deps", "--reinstall", str(wheel)]
        return [*self.argv, "install", "--no-deps", "--force-reinstall", str(wheel)]

    def wheel_cmd(self, source: Path, out_dir: Path) -> list[str]:
        if self.kind == "uv":
            uv_args = ["build", "--wheel", "--no-build-isolation", "--python", sys.executable, "-o", str(out_dir)]
            return [*self.argv, *uv_args, str(source)]
        return [*self.argv, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out_dir), str(source)]


def _run(cmd: list[str], out, env=None, cwd=None) -> None:
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise PipelineError(f"'{' '.join(cmd[:3])} ...' failed with exit {proc.returncode} (log: {out.name})")


def main(argv: list[str] | None = None) -> int:
    """``zero3-sp install --pypi X``: install unpatched DeepSpeed X from its verified sdist."""

    from patch_and_test.core import source

    parser = CommandParser(prog="zero3-sp install", description=main.__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--pypi", metavar="VERSION", help="a supported DeepSpeed release (sdist pinned by sha256)")
    what.add_argument("--tree", type=Path, help="a git work tree of DeepSpeed (its committed HEAD is installed)")
    parser.add_argument("--log", type=Path, default=None, help="default: <cache>/logs/install-<version>.log")
    args = parser.parse_args(argv)
    try:
        tree = source.from_pypi(args.pypi).path if args.pypi else args.tree
        log = args.log or cache_root() / "logs" / f"install-{args.pypi or tree.name}.log"
        done = install_tree(tree, log)
    except PipelineError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    print(f"installed deepspeed {done.version} from {tree} ({'cached wheel' if done.cached_wheel else 'built'}, "
          f"{done.installer})")
    return 0
