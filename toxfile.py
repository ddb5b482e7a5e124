"""tox inline plugin: a command that exits 77 (our "skipped") ends its env as SKIP, not FAIL.

An nccl cell on a machine with fewer GPUs than ranks writes a "skipped" verdict and exits 77.
tox has no skip exit code: the cell would read FAIL and `tox -m matrix` could never pass on a
CPU-only machine, while `ignore_outcome` would let a real failure pass too. The reason the job
printed becomes tox's "skipped because ..." line, so the skip stays visible in the summary.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from tox.plugin import impl
from tox.tox_env.errors import Skip


def _exit_codes() -> Any:
    # Loaded by path: tox's own interpreter has the plugin's folder, not the package, on its path.
    path = Path(__file__).resolve().parent / "repro" / "harness" / "exit_codes.py"
    spec = importlib.util.spec_from_file_location("zero3_sp_exit_codes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SKIPPED = _exit_codes().SKIPPED


def skip_reason(outcome: Any) -> str:
    """The job's one-line "skipped: <reason>" (or the last line it wrote) from a tox Outcome."""
    lines = [line.strip() for line in f"{outcome.out or ''}\n{outcome.err or ''}".splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("skipped: "):
            return line[len("skipped: "):]
    return lines[-1] if lines else f"exit {SKIPPED}"


@impl
def tox_after_run_commands(tox_env: Any, exit_code: int, outcomes: list[Any]) -> None:
    if exit_code == SKIPPED and outcomes and outcomes[-1].exit_code == SKIPPED:
        raise Skip(skip_reason(outcomes[-1]))
