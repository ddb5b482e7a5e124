"""tox inline plugin: exit 77 ends an env as SKIP with the job's reason; ``{torch_requirement}``; every DeepSpeed
version from deepspeed-sdists.lock (tox.ini names none) and an env's DEEPSPEED_VERSION from its dsX.Y.Z factor.
Why: docs/code/benchmarks.md ("toxfile.py")."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from packaging.version import Version
from tox.plugin import impl
from tox.tox_env.errors import Skip


def _load(rel: str, name: str) -> Any:
    # Loaded by path: tox's own interpreter has the plugin's folder, not the package, on its path.
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SKIPPED = _load("repro/harness/exit_codes.py", "zero3_sp_exit_codes").SKIPPED
_PINS = _load("patch_and_test/core/pins.py", "zero3_sp_pins")
_FILES = _load("repro/harness/files.py", "zero3_sp_files")
LOCK = Path(__file__).resolve().parent / "deepspeed-sdists.lock"
_DS_FACTOR = re.compile(r"ds(\d+\.\d+\.\d+)")


def locked_versions(lock: Path = LOCK) -> list[str]:
    """The lock's ``[sdist."X.Y.Z"]`` releases, oldest first (load_lock's keys; the package is not importable here)."""
    return sorted(_FILES.load_toml(lock).get("sdist", {}), key=Version)


def env_deepspeed_version(env_name: str) -> str | None:
    """X.Y.Z of the env name's dsX.Y.Z factor (tests-dsX.Y.Z, patch-and-test-dsX.Y.Z-gloo), else None."""
    return next((m[1] for factor in env_name.split("-") if (m := _DS_FACTOR.fullmatch(factor))), None)


def skip_reason(outcome: Any) -> str:
    """The job's one-line "skipped: <reason>" (or the last line it wrote) from a tox Outcome."""
    lines = [line.strip() for line in f"{outcome.out or ''}\n{outcome.err or ''}".splitlines() if line.strip()]
    reason = next((line.removeprefix("skipped: ") for line in reversed(lines) if line.startswith("skipped: ")), None)
    return reason or (lines[-1] if lines else f"exit {SKIPPED}")


def skip_for(exit_code: int, outcomes: list[Any]) -> str | None:
    """Why the env is skipped, or None when tox's own handling stands (only a last command that exited 77 skips)."""
    if exit_code == SKIPPED and outcomes and outcomes[-1].exit_code == SKIPPED:
        return skip_reason(outcomes[-1])
    return None


@impl
def tox_add_core_config(core_conf: Any, state: Any) -> None:
    core_conf.add_config(keys=["torch_requirement"], of_type=str, default=_PINS.torch_requirement(),
                         desc="the torch every env installs: torch$TORCH_SPEC, else requirements/pins.txt's pin")
    # Read by tox.ini's env_list and labels: a release added to the lock is in the matrix at once.
    versions = locked_versions()
    core_conf.add_config(keys=["deepspeed_versions"], of_type=str, default=",".join(versions),
                         desc="deepspeed-sdists.lock's releases, oldest first, comma-separated")
    core_conf.add_config(keys=["deepspeed_newest"], of_type=str, default=versions[-1], desc="the lock's newest")
    core_conf.add_config(keys=["deepspeed_oldest"], of_type=str, default=versions[0], desc="the lock's oldest")


@impl
def tox_add_env_config(env_conf: Any, state: Any) -> None:
    version = env_deepspeed_version(env_conf.name)
    # A tox.ini factor condition cannot name the newest without naming a version: the ALST tests' extra deps.
    newest = version is not None and version == state.conf.core["deepspeed_newest"]
    env_conf.add_config(keys=["alst_if_newest"], of_type=str, default="-r requirements/alst.txt" if newest else "",
                        desc="requirements/alst.txt where the env's dsX.Y.Z is the lock's newest, else nothing")
    if version is not None:
        # set_env, not a default: it must win over a passed-through DEEPSPEED_VERSION, as tox.ini's lines did.
        env_conf["set_env"].update({"DEEPSPEED_VERSION": version})


@impl
def tox_after_run_commands(tox_env: Any, exit_code: int, outcomes: list[Any]) -> None:
    reason = skip_for(exit_code, outcomes)
    if reason is not None:
        raise Skip(reason)
