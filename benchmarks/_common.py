"""Shared by the benchmarks: run a reproducer launch and time it; write results through their models."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "benchmarks"
if str(ROOT) not in sys.path:  # a script's own folder is on the path, not the checkout
    sys.path.insert(0, str(ROOT))

from patch_and_test.review.benchmark_reports import Environment, ResultFile, Targeted, Timed  # noqa: E402


def timed_run(python: str, script: Path, *argv: str, timeout: float = 900) -> Timed:
    start = time.monotonic()
    proc = subprocess.run([python, str(script), *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return Timed(argv=[str(script.name), *argv], returncode=proc.returncode, wall_s=round(time.monotonic() - start, 3),
                 teardown_notes=sum("during teardown" in line for line in proc.stderr.splitlines()),
                 stderr_tail=proc.stderr[-2000:])


def environment(python: str) -> Environment:
    # Versions, not this machine's paths: a reader elsewhere has neither the interpreter nor its folder.
    code = ("import importlib.metadata as m, platform, torch; "
            "print(m.version('deepspeed'), torch.__version__, platform.python_version())")
    probe = subprocess.run([python, "-c", code], capture_output=True, text=True)
    ds, torch_version, py_version = (probe.stdout.split() + ["?", "?", "?"])[:3]
    return Environment(python=py_version, deepspeed=ds, torch=torch_version, platform=platform.platform(),
                       cpus=os.cpu_count(), load_average_at_start=os.getloadavg())


def _machine_prefixes() -> list[tuple[str, str]]:
    """This machine's folders -> what a kept result says instead, longest first."""
    names = {str(Path.home()): "~", sys.base_prefix: "<python>", sys.prefix: "<python>"}
    for python in {sys.executable, default_python()}:
        for exe in (Path(python), Path(python).resolve()):  # the interpreter's venv, and what it links to
            names[str(exe.parent.parent)] = "<python>"
    names[str(ROOT)] = "."
    return sorted(((k, v) for k, v in names.items() if len(k) > 1), key=lambda kv: -len(kv[0]))


def portable(value: Any, prefixes: list[tuple[str, str]] | None = None) -> Any:
    """The value with this machine's folders replaced by "." / "<python>" / "~" (a kept result names versions)."""
    prefixes = _machine_prefixes() if prefixes is None else prefixes
    if isinstance(value, dict):
        return {k: portable(v, prefixes) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, prefixes) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        for prefix, name in prefixes:
            value = re.sub(re.escape(prefix) + r"(?=/|$|[\s\"'])", lambda _: name, value)
        return value[2:] if value.startswith("./") else value  # a path in the checkout: relative to it
    return value


def write_result(result: ResultFile, out: Path | None) -> Path:
    """Write ``result`` (default results/benchmarks/<benchmark>.json) with this machine's folders made portable."""
    path = out or RESULTS / f"{result.benchmark}.json"
    type(result).from_dict(portable(result.to_dict())).write(path)
    return path


def finish(result: Targeted, out: Path | None, summary: str) -> int:
    """Write the result, print the one-line summary and where it went; exit 0 when the target is met, else 1."""
    print(f"{summary}; {write_result(result, out)}")
    return 0 if result.meets_target else 1


def default_python() -> str:
    return os.environ.get("BENCH_PYTHON", sys.executable)
