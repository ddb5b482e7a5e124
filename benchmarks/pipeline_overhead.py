#!/usr/bin/env python
"""Pipeline overhead: a warm ``zero3-sp run`` (no audit) against its four reproducer launches, target
total/launches <= 2.0. Writes results/benchmarks/pipeline_overhead.json; installs DeepSpeed into this interpreter.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from _common import RESULTS, ROOT, environment, finish  # noqa: E402
from patch_and_test.review.benchmark_reports import PipelineOverhead  # noqa: E402
from patch_and_test.core.checks import REPRODUCERS  # noqa: E402
from patch_and_test.job.verdict import Verdict  # noqa: E402

TARGET = 2.0


def pipeline(version: str, results: Path) -> tuple[float, Verdict]:
    shutil.rmtree(results, ignore_errors=True)
    job = [sys.executable, "-m", "patch_and_test", "run"]
    cmd = [*job, "--version", version, "--no-audit", "--results", str(results)]
    start = time.monotonic()
    proc = subprocess.run([*cmd, "--env-name", "pipeline-overhead"], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    verdict = Verdict.load(results / "verdict.json")
    if proc.returncode != 0:
        raise SystemExit(f"error: the job exited {proc.returncode}: {verdict.error or proc.stdout[-800:]}")
    return round(wall, 3), verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="0.19.8", help="the DeepSpeed release the job runs on (default 0.19.8)")
    parser.add_argument("--warm-up", action="store_true", help="run the job once first to fill the caches")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default results/benchmarks/pipeline_overhead.json)")
    args = parser.parse_args(argv)
    env = environment(sys.executable)
    out = args.out or RESULTS / "pipeline_overhead.json"
    results = out.parent / "pipeline_overhead_run"
    if args.warm_up:
        pipeline(args.version, results)
    total, verdict = pipeline(args.version, results)
    launches = {c.name: c.duration_s for c in verdict.before + verdict.after if c.script in REPRODUCERS}
    steps = {s.name: s.duration_s for s in verdict.steps}
    cached = all("cached wheel" in s.detail for s in verdict.steps if s.name.startswith("install"))
    if len(launches) != 2 * len(REPRODUCERS):
        raise SystemExit(f"error: expected {2 * len(REPRODUCERS)} reproducer launches, the verdict has {launches}")
    launch_total = round(sum(launches.values()), 3)
    ratio = round(total / launch_total, 3)
    met = ratio <= TARGET and cached
    overhead = round(total - launch_total, 3)
    result = PipelineOverhead(benchmark="pipeline_overhead", environment=env, version=args.version, warm=cached,
                              pipeline_wall_s=total, pipeline_steps_s=steps, launches_s=launches,
                              launches_total_s=launch_total, overhead_s=overhead, ratio_total_over_launches=ratio,
                              verdict=str(results / "verdict.json"), target=TARGET, meets_target=met)
    return finish(
        result, out, f"{'warm' if cached else 'NOT warm (a wheel was built)'} job {total:.1f} s; its four reproducer "
        f"launches {launch_total:.1f} s; ratio {ratio} (target <= {TARGET}): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
