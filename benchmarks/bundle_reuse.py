#!/usr/bin/env python
"""Bundle reuse: a second ``zero3-sp bundle build`` without changes reuses every cell in < 10% of the first's
time (or of --first-run-s). Writes results/benchmarks/bundle_reuse.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, environment, finish  # noqa: E402
from patch_and_test.review.benchmark_reports import BundleReuse  # noqa: E402

TARGET = 0.10


def build(dist: Path, versions: list[str]) -> tuple[float, str]:
    start = time.monotonic()
    only = ["--versions", *versions] if versions else []
    cmd = [sys.executable, "-m", "patch_and_test", "bundle", "build", "--dist", str(dist), *only]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = round(time.monotonic() - start, 3)
    if proc.returncode != 0:
        raise SystemExit(f"error: bundle build exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return wall, proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="where the bundles are built (default dist/)")
    parser.add_argument("--first-run-s", type=float, default=None,
                        help="wall time of the run that produced the current results, when the first build reuses")
    parser.add_argument("--versions", nargs="*", default=[], help="restrict the matrix, as bundle build does")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default results/benchmarks/bundle_reuse.json)")
    args = parser.parse_args(argv)
    env = environment(sys.executable)
    first, first_line = build(args.dist, args.versions)
    second, second_line = build(args.dist, args.versions)
    reference = max(first, args.first_run_s or 0.0)
    ratio = round(second / reference, 4)
    summary = (f"first {first:.1f} s ({first_line}); second {second:.1f} s ({second_line}); ratio {ratio} "
               f"against {reference:.1f} s (target < {TARGET})")
    met = ratio < TARGET and "reused" in second_line
    result = BundleReuse(benchmark="bundle_reuse", environment=env, first_build_s=first,
                         first_build_summary=first_line, first_run_s_given=args.first_run_s, second_build_s=second,
                         second_build_summary=second_line, ratio_second_over_first=ratio, target=TARGET,
                         meets_target=met)
    return finish(result, args.out, summary)


if __name__ == "__main__":
    sys.exit(main())
