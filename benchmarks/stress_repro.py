#!/usr/bin/env python
"""Stress: N consecutive launches of each reproducer must all give the same verdict.

About 12% of 2-rank DeepSpeed runs abort at process exit after the work succeeded
(docs/runtime-facts.md). The launcher absorbs that (ranks leave with os._exit after reporting;
a rank that reported and then died is counted as done). This loop proves it: every launch
of a script must return the same exit code, and it counts how many launches needed the
absorption. Writes results/benchmarks/stress_repro.json.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, default_python, environment, timed_run, write_result  # noqa: E402

SCRIPTS = ("zero3_sp_grad_scale.py", "zero3_sp_mixed_bucket.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=50)
    parser.add_argument("--expect", choices=["buggy", "fixed"], default="buggy")
    parser.add_argument("--python", default=default_python())
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    summary = {}
    for name in SCRIPTS:
        codes = collections.Counter()
        notes = 0
        failures = []
        for i in range(args.launches):
            run = timed_run(args.python, ROOT / "repro" / name, "--expect", args.expect, "--backend", "gloo")
            codes[run.returncode] += 1
            notes += run.teardown_notes
            if run.returncode != 0:
                failures.append({"launch": i, "returncode": run.returncode, "stderr_tail": run.stderr_tail})
            print(f"{name} #{i + 1}: exit {run.returncode} ({run.wall_s} s)", flush=True)
        summary[name] = {"launches": args.launches, "exit_codes": dict(codes), "same_verdict_every_time": len(codes) == 1,
                         "launches_with_absorbed_teardown_abort": notes, "failures": failures[:5]}
    ok = all(s["same_verdict_every_time"] and 0 in s["exit_codes"] for s in summary.values())
    path = write_result("stress_repro", {"benchmark": "stress_repro", "environment": environment(args.python),
                                         "expect": args.expect, "scripts": summary, "ok": ok}, args.out)
    for name, s in summary.items():
        print(f"{name}: {s['exit_codes']} over {s['launches']} launches; "
              f"teardown aborts absorbed: {s['launches_with_absorbed_teardown_abort']}")
    print(f"{'OK' if ok else 'FAILED'}: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
