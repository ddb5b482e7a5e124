#!/usr/bin/env python
"""Launch cost: a warm launch of all six configurations against one of a single configuration, alternating after
one warm-up of each; target ratio <= 1.5. Writes results/benchmarks/launch_cost.json. More: docs/code/benchmarks.md"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, default_python, environment, finish, timed_run  # noqa: E402
from patch_and_test.review.benchmark_reports import LaunchCost  # noqa: E402

SCRIPT = ROOT / "repro" / "zero3_sp_grad_scale.py"
TARGET = 1.5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed launches of each kind (default 5)")
    parser.add_argument("--python", default=default_python(), help="interpreter with torch + DeepSpeed")
    parser.add_argument("--single", default="zero3 rs=True cg=True bucket=500", help="the one-config launch")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default results/benchmarks/launch_cost.json)")
    args = parser.parse_args(argv)
    env = environment(args.python)

    common = ["--expect", "buggy", "--backend", "gloo"]
    single_argv = [*common, "--config", args.single]
    for warm_up in (common, single_argv):  # warm-up: comm op build, page cache
        timed_run(args.python, SCRIPT, *warm_up)
    runs = {"all_six": [], "single": []}
    for _ in range(args.repeats):
        runs["all_six"].append(timed_run(args.python, SCRIPT, *common))
        runs["single"].append(timed_run(args.python, SCRIPT, *single_argv))
    failed = [r for rs in runs.values() for r in rs if r.returncode not in (0, 1)]
    med = {k: round(statistics.median(r.wall_s for r in v), 3) for k, v in runs.items()}
    ratio = round(med["all_six"] / med["single"], 3)
    met = ratio <= TARGET and not failed
    result = LaunchCost(benchmark="launch_cost", environment=env, repeats=args.repeats, median_wall_s=med,
                        ratio_all_six_over_single=ratio, runs=runs, target=TARGET, meets_target=met)
    return finish(
        result, args.out, f"all six: {med['all_six']} s, single: {med['single']} s (medians of {args.repeats}); "
        f"ratio {ratio} (target <= {TARGET}) -> {'OK' if met else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
