"""tox inline plugin: a command that exits 77 (our "skipped") ends its env as SKIP, not FAIL, with the job's
reason; and ``{torch_requirement}`` for tox.ini (torch$TORCH_SPEC, else requirements/pins.txt's pin).
Why: docs/code/benchmarks.md ("toxfile.py").
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

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


def skip_reason(outcome: Any) -> str:
    """The job's one-line "skipped: <reason>" (or the last line it wrote) from a tox Outcome."""
    lines = [line.strip() for line in f"{outcome.out or ''}\n{outcome.err or ''}".splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("skipped: "):
            return line[len("skipped: "):]
    return lines[-1] if lines else f"exit {SKIPPED}"


def skip_for(exit_code: int, outcomes: list[Any]) -> str | None:
    """Why the env is skipped, or None when tox's own handling stands (only a last command that exited 77 skips)."""
    if exit_code == SKIPPED and outcomes and outcomes[-1].exit_code == SKIPPED:
        return skip_reason(outcomes[-1])
    return None


@impl
def tox_add_core_config(core_conf: Any, state: Any) -> None:
    core_conf.add_config(keys=["torch_requirement"], of_type=str, default=_PINS.torch_requirement(),
                         desc="the torch every env installs: torch$TORCH_SPEC, else requirements/pins.txt's pin")


@impl
def tox_after_run_commands(tox_env: Any, exit_code: int, outcomes: list[Any]) -> None:
    reason = skip_for(exit_code, outcomes)
    if reason is not None:
        raise Skip(reason)
