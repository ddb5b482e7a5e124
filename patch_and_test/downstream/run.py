"""``zero3-sp downstream run``: the real clients' sp loss on unpatched and patched DeepSpeed.

One run = one client environment (one tox/nox env): its clients are installed here, then DeepSpeed from its
verified sdist, unpatched (``repro/downstream_clients.py --expect buggy``) and with the series' fix and marker
(``--expect fixed``). Results: ``results/downstream/<env>/{unpatched,patched}/downstream_clients.{json,log}`` and
``run.json``. Exit codes: 0 both runs hold; 1 one does not; 2 a step or a run could not run; 77 nothing to
measure (no client installed).

More: docs/code/patch-and-test-downstream-doctor.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any, ClassVar
from pathlib import Path

from patch_and_test.core import checks
from patch_and_test.core import install
from patch_and_test.core import series as series_mod
from patch_and_test.core import source as source_mod
from patch_and_test.core.errors import CommandParser, BadInput, Exit, PipelineError, positive_seconds
from repro.downstream.expect import CLIENTS, MARKER_NAME
from repro.harness.env import cache_root, dist_version
from repro.harness.files import relative_to
from repro.harness.report import JsonReport

SCRIPT = "downstream_clients"
RESULTS_ROOT = Path("results") / "downstream"


class DownstreamRun(JsonReport):
    """``results/downstream/<env>/run.json``: what ran, on what, and where each report is."""
    SCHEMA: ClassVar[str] = "zero3-sp-gradfix/downstream-run/v1"

    env: str
    deepspeed_version: str
    series: str
    applied: list[str]
    marker_source: str  # "series <the marker patch>" (kept runs of older series: "series 0001")
    clients: dict[str, str]  # distribution -> version, as installed here
    transformers_patches: list[str]
    steps: list[dict[str, Any]]  # name, detail, duration_s
    checks: list[checks.ReproCheck]  # report and log relative to the results folder
    exit_code: int = 2
    wall_time_s: float | None = None
    error: str | None = None


def marker_patch(series: series_mod.Series) -> str:
    """The series' marker patch (a backport's last): the patched build a client sees must carry the marker."""
    found = [p.file for p in series.patches if p.role == "marker"]
    if not found:
        raise BadInput(f"series {series.name} has no marker patch: a released build with the fix needs "
                       f"{MARKER_NAME} (see patches/series.toml, role marker)")
    return found[0]


def install_patched_transformers(version: str, patches_dir: Path, log: Path, cache: Path) -> list[str]:
    patches = sorted(patches_dir.glob("*.patch"))
    if not patches:
        raise BadInput(f"no *.patch in {patches_dir}")
    archive = source_mod.download_sdist(version, cache / "sdists", package="transformers")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        tree = Path(tmp) / f"transformers-{version}"
        for patch in patches:  # any failure is an error: nothing installed
            _run(["patch", "-p1", "--batch", "--forward", "-d", str(tree), "-i", str(patch.resolve())], log)
        _run(_installer_cmd("--no-deps", "--reinstall", str(tree)), log)
    return [p.name for p in patches]


def _installer_cmd(*args: str, as_python: str | None = None) -> list[str]:
    inst = install.Installer.find()
    if inst.kind == "uv":
        extra = ["--python-version", as_python] if as_python else []
        return [*inst.argv, "pip", "install", "--python", sys.executable, *extra, *args]
    extra = ["--ignore-requires-python"] if as_python else []
    return [*inst.argv, "install", *extra, *[a.replace("--reinstall", "--force-reinstall") for a in args]]


def _run(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise PipelineError(f"'{' '.join(cmd[:4])} ...' failed with exit {proc.returncode} (log: {log})")


def run(env: str, results: Path, version: str | None, specs: list[str], tf_patches: Path | None,
        tf_version: str | None, backend: str, timeout: float, as_python: str | None = None) -> DownstreamRun:
    started = time.monotonic()
    results.mkdir(parents=True, exist_ok=True)
    version = version or source_mod.newest_locked()
    record = DownstreamRun(env=env, deepspeed_version=version, series="", applied=[], marker_source="", clients={},
                           transformers_patches=[], steps=[], checks=[])

    def step(name: str, detail: str, t: float) -> None:
        record.steps.append({"name": name, "detail": detail, "duration_s": round(time.monotonic() - t, 3)})
        print(f"[{env}] {name}: {detail}", flush=True)

    tree = None
    try:
        t, log = time.monotonic(), results / "install-clients.log"
        if specs:  # without dependencies (the env provides them); as_python: past their Requires-Python
            _run(_installer_cmd("--no-deps", *specs, as_python=as_python), log)
        if tf_patches is not None:
            record.transformers_patches = install_patched_transformers(tf_version or "5.25.0", tf_patches, log,
                                                                       cache_root())
        record.clients = {c.dist: v for c in CLIENTS if (v := dist_version(c.dist))}  # the installed ones
        shown = ", ".join(f"{d} {v}" for d, v in record.clients.items()) or "none"
        step("clients", shown + (f" (--install specs installed as for Python {as_python})" if as_python else ""), t)

        t = time.monotonic()
        tree = source_mod.from_pypi(version)
        chosen = series_mod.series_for_tree(tree.path)
        applied = series_mod.apply_series(tree.path, chosen)
        record.series, record.applied = chosen.name, list(applied.applied)
        record.marker_source = f"series {marker_patch(chosen)}"
        step(
            "source", f"DeepSpeed {tree.version} sdist; {applied.summary().splitlines()[0]}; marker: "
            f"{record.marker_source}", t)

        for phase, rev, expect in (("unpatched", applied.base, "buggy"), ("patched", "HEAD", "fixed")):
            t = time.monotonic()
            done = install.install_tree(tree.path, results / f"install-{phase}.log", rev=rev)
            step(f"install {phase}", f"deepspeed {done.version}", t)
            t = time.monotonic()
            check = checks.run_reproducer(SCRIPT, expect, results / phase, phase, backend=backend, timeout=timeout)
            record.checks.append(relative_check(check, results))
            shown = record.checks[-1].report
            step(f"{phase}: {SCRIPT} --expect {expect}", f"exit {check.exit_code} (report {shown})", t)
        codes = {c.exit_code for c in record.checks}
        outcome = Exit.SKIPPED if codes <= {Exit.SKIPPED} else Exit.NOT_FIXED if Exit.NOT_FIXED in codes else Exit.OK
        record.exit_code = int(outcome if codes <= {Exit.OK, Exit.NOT_FIXED, Exit.SKIPPED} else Exit.ERROR)
    except PipelineError as err:
        record.error, record.exit_code = str(err), int(err.exit_code)
    finally:
        if tree is not None:
            tree.release()
        record.wall_time_s = round(time.monotonic() - started, 3)
        record.write(results / "run.json")
    return record


def relative_check(check: checks.ReproCheck, results: Path) -> checks.ReproCheck:
    """The check with its report and log relative to the results folder, valid where it is copied (bundle, docs)."""
    return check.model_copy(
        update=dict(report=relative_to(check.report, results), log=relative_to(check.log, results)))


# The downstream envs: env -> its requirements file (installed by tox / nox) and the clients this driver installs
# without their dependencies. tox.ini names the files per env; the driver and noxfile.py read this table.
CLIENT_ENVS: dict[str, tuple[str, tuple[str, ...]]] = {
    "downstream-tf5.25": ("requirements/downstream.txt", ("--install", "transformers==5.25.0")),
    "downstream-tf5.24": ("requirements/downstream.txt", ("--install", "transformers==5.24.0")),
    "downstream-tf5.25-patched":
    ("requirements/downstream.txt", ("--transformers-patches", "patches/downstream/transformers",
                                     "--transformers-version", "5.25.0")),
    "downstream-arctic": ("requirements/downstream-arctic.txt", ("--install", "arctic-training==0.8.0")),
    "downstream-trl":
    ("requirements/downstream-trl.txt", ("--install", "transformers==5.25.0", "--install", "trl==1.16.0")),
    # axolotl 0.21 requires Python >= 3.12 (docs/downstream-notice.md, Census): installed past it.
    "downstream-axolotl":
    ("requirements/downstream-axolotl.txt", ("--install", "axolotl==0.21.0", "--as-python", "3.12")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="zero3-sp downstream run", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-name", default=os.environ.get("TOX_ENV_NAME") or os.environ.get("NOX_SESSION_NAME")
                        or "downstream", help="names the results folder (default: the tox/nox env)")
    parser.add_argument("--results", type=Path, default=None, help="default: results/downstream/<env-name>")
    parser.add_argument("--version", default=os.environ.get("DEEPSPEED_VERSION") or None,
                        help="DeepSpeed release (default: the newest in deepspeed-sdists.lock)")
    parser.add_argument("--install", action="append", default=[], metavar="SPEC",
                        help="a client to install here without its dependencies, e.g. transformers==5.24.0")
    parser.add_argument("--as-python", default=None, metavar="X.Y",
                        help="install the --install specs as for Python X.Y (past their Requires-Python)")
    parser.add_argument("--transformers-patches", type=Path, default=None, metavar="DIR",
                        help="build transformers from its PyPI sdist with DIR/*.patch applied (patch -p1)")
    parser.add_argument("--transformers-version", default="5.25.0", help="the sdist --transformers-patches is for")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=os.environ.get("ZERO3_SP_BACKEND", "gloo"),
                        help="gloo: CPU ranks; nccl: one GPU per rank (default: env ZERO3_SP_BACKEND, else gloo)")
    parser.add_argument("--timeout", type=positive_seconds, default=1200.0,
                        help="deadline per reproducer launch, s (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if not (args.install or args.transformers_patches) and args.env_name in CLIENT_ENVS:
        # A known env without its clients named: its own, from CLIENT_ENVS (how tox and nox call it).
        args = build_parser().parse_args([*CLIENT_ENVS[args.env_name][1], *argv])
    results = (args.results or RESULTS_ROOT / args.env_name).resolve()
    if args.transformers_patches is not None and not args.transformers_patches.is_dir():
        print(f"error: --transformers-patches {args.transformers_patches}: not a folder", file=sys.stderr)
        return 2
    record = run(args.env_name, results, args.version, args.install, args.transformers_patches,
                 args.transformers_version, args.backend, args.timeout, args.as_python)
    if record.error:
        print(f"error: {record.error}", file=sys.stderr)
    for c in record.checks:
        print(f"[{args.env_name}] {c.name} --expect {c.expect}: exit {c.exit_code}")
    print(f"run: {results / 'run.json'}")
    return record.exit_code
