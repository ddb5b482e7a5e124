"""Shared by the benchmarks: run a reproducer launch and time it; write results as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "benchmarks"


@dataclasses.dataclass(frozen=True)
class Timed:
    argv: list[str]
    returncode: int
    wall_s: float
    teardown_notes: int  # "reported ... then exited with signal" lines: the abort at exit, absorbed
    stderr_tail: str


def timed_run(python: str, script: Path, *argv: str, timeout: float = 900) -> Timed:
    start = time.monotonic()
    proc = subprocess.run([python, str(script), *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall = time.monotonic() - start
    notes = sum("during teardown" in line for line in proc.stderr.splitlines())
    return Timed([str(script.name), *argv], proc.returncode, round(wall, 3), notes, proc.stderr[-2000:])


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def environment(python: str) -> dict:
    # Versions, not this machine's paths: a reader elsewhere has neither the interpreter nor its folder.
    probe = subprocess.run([python, "-c", "import importlib.metadata as m, platform, torch; "
                            "print(m.version('deepspeed'), torch.__version__, platform.python_version())"],
                           capture_output=True, text=True)
    ds, torch_version, py_version = (probe.stdout.split() + ["?", "?", "?"])[:3]
    return {"python": py_version, "deepspeed": ds, "torch": torch_version, "platform": platform.platform(),
            "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}


def write_result(name: str, payload: dict, out: Path | None) -> Path:
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def default_python() -> str:
    return os.environ.get("BENCH_PYTHON", sys.executable)
