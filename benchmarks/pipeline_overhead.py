#!/usr/bin/env python
"""Pipeline overhead: a warm ``python -m patch_and_test`` against its own reproducer launches.

One run: first a warm-up pipeline (downloads, builds and caches both wheels and the comm op),
then, side by side, a warm pipeline and the bare launches it makes (both reproducers with
--expect buggy on the unpatched build, both with --expect fixed on the patched one; the
parity audit and ALST steps are left out of both, --no-audit and no transformers needed). The
pipeline's own work (source, series, installs, twin test) is total - launches. Target (issue:
one command): total / launches <= 2.0. Writes results/benchmarks/pipeline_overhead.json.

Uses the interpreter it runs in: it installs DeepSpeed into it (the patched build stays).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, environment, timed_run, write_result  # noqa: E402

TARGET = 2.0
REPRODUCERS = ("zero3_sp_grad_scale", "zero3_sp_mixed_bucket")


def pipeline(version: str, results: Path) -> tuple[float, dict]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "patch_and_test", "--version", version, "--no-audit", "--results",
                           str(results), "--env-name", "bench"], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    verdict = json.loads((results / "verdict.json").read_text())
    if proc.returncode != 0:
        raise SystemExit(f"error: the pipeline exited {proc.returncode}: {verdict.get('error') or proc.stdout[-800:]}")
    return round(wall, 3), verdict


def install(version: str, patched_tree: Path | None) -> None:
    argv = ["--tree", str(patched_tree)] if patched_tree else ["--pypi", version]
    subprocess.run([sys.executable, "-m", "patch_and_test.install", *argv], cwd=ROOT, check=True,
                   capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="0.19.8")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = environment(sys.executable)
    with tempfile.TemporaryDirectory(prefix="pipeline-overhead.") as tmp:
        pipeline(args.version, Path(tmp) / "warm-up")
        total, verdict = pipeline(args.version, Path(tmp) / "measured")
        steps = {s["name"]: s["duration_s"] for s in verdict["steps"]}
        patched_tree = Path(verdict["source"]["path"])  # our copy, left on the patched branch
        launches = {}
        install(args.version, None)
        for script in REPRODUCERS:
            launches[f"before/{script}"] = timed_run(sys.executable, ROOT / "repro" / f"{script}.py", "--expect",
                                                     "buggy", "--backend", "gloo")
        install(args.version, patched_tree)
        for script in REPRODUCERS:
            launches[f"after/{script}"] = timed_run(sys.executable, ROOT / "repro" / f"{script}.py", "--backend",
                                                    "gloo")
    failed = {k: t.returncode for k, t in launches.items() if t.returncode != 0}
    if failed:
        raise SystemExit(f"error: bare launches failed: {failed}")
    launch_total = round(sum(t.wall_s for t in launches.values()), 3)
    ratio = round(total / launch_total, 3)
    payload = {"benchmark": "pipeline_overhead", "environment": env, "version": args.version,
               "pipeline_wall_s": total, "pipeline_steps_s": steps,
               "bare_launches_s": {k: t.wall_s for k, t in launches.items()}, "bare_launches_total_s": launch_total,
               "overhead_s": round(total - launch_total, 3), "ratio_total_over_launches": ratio, "target": TARGET,
               "meets_target": ratio <= TARGET}
    path = write_result("pipeline_overhead", payload, args.out)
    print(f"warm pipeline {total:.1f} s; its four reproducer launches bare {launch_total:.1f} s; ratio {ratio} "
          f"(target <= {TARGET}): {'met' if ratio <= TARGET else 'NOT met'}; {path}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
