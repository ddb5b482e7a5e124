"""The pipeline's verdict: every step's result, one outcome, one exit code. Pure logic.

Outcome rules (exit code in brackets, see errors.Exit):
* ``skipped`` [77]: a reproducer could not run here (e.g. nccl without the GPUs).
* ``error`` [2]: a check could not run (crash, deadline).
* ``bug-not-reproduced`` [3]: unpatched, a reproducer did not show exactly the known pattern.
* ``already-fixed`` [5]: the tree carried the fix before we touched it; the "after" checks ran.
* ``regression`` [6]: a DeepSpeed test the series can reach (``affected``) passed before the
  series and fails after, on every rerun, or a test the series adds fails.
* ``not-fixed`` [1]: patched, a reproducer, the twin test or the upstream regression test
  still fails.
* ``fixed`` [0]: the bug was seen before and is gone after, on every check.
An upstream suite whose run crashed, hit its deadline, or collected fewer tests after than
before is an ``error`` [2], never "no regressions". Its tests that fail both before and after
are pre-existing, and a test that failed once and passed on a rerun is flaky: both are
reported, and neither changes the outcome.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from patch_and_test.checks import PytestCheck, ReproCheck
from patch_and_test.affected import Selection
from patch_and_test.errors import Exit
from repro.harness.files import write_json
from patch_and_test.upstream_suite import SuiteComparison, compare as compare_suites  # noqa: F401 (re-exported)

SCHEMA = "zero3-sp-gradfix/verdict/v1"


@dataclasses.dataclass
class Step:
    name: str
    status: str  # "ok" | "failed" | "skipped" | "error" | "warning" (a check that warns, never fails the job)
    detail: str
    duration_s: float = 0.0
    log: str | None = None


@dataclasses.dataclass
class Verdict:
    env: str
    source: dict[str, Any]
    series: dict[str, Any] | None
    deepspeed_before: str | None
    deepspeed_after: str | None
    backend: str
    steps: list[Step]
    before: list[ReproCheck]
    after: list[ReproCheck]
    tests: list[PytestCheck]  # run once, after the series (twin, upstream regression test)
    suites: list[SuiteComparison]  # DeepSpeed's tests the series can reach, run before and after
    already_fixed: bool = False
    affected: Selection | None = None  # the DeepSpeed test files the series can reach, and why
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)  # content hashes (patch_and_test.inputs)
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    wall_time_s: float | None = None
    # Installed clients (transformers, ...) whose sp gradients the downstream rule says are mis-scaled with the
    # patched build (patch_and_test.client_check): warnings, not failures of the fix.
    client_warnings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    error: str | None = None  # a PipelineError's one-line message, when one ended the run
    error_exit: int | None = None
    schema: str = SCHEMA

    @property
    def outcome(self) -> str:
        return decide(self)[0]

    @property
    def exit_code(self) -> int:
        return int(decide(self)[1])

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(outcome=self.outcome, exit_code=self.exit_code)
        return data

    def write(self, path: Path) -> None:
        write_json(path, self.to_dict())


def decide(v: Verdict) -> tuple[str, Exit]:
    if v.error is not None:
        code = Exit(v.error_exit if v.error_exit is not None else Exit.ERROR)
        return {Exit.SKIPPED: "skipped", Exit.SERIES_DOES_NOT_APPLY: "series-does-not-apply",
                Exit.ALREADY_FIXED: "already-fixed"}.get(code, "error"), code
    checks = [*v.before, *v.after]
    if any(c.exit_code == Exit.SKIPPED for c in checks):
        return "skipped", Exit.SKIPPED
    tests_broken = any(t.exit_code not in (0, 1) or not t.outcomes for t in v.tests)
    if any(c.exit_code not in (0, 1) for c in checks) or tests_broken or any(s.status == "error" for s in v.suites):
        return "error", Exit.ERROR
    if not v.already_fixed and (not v.before or not all(c.holds for c in v.before)):
        return "bug-not-reproduced", Exit.BUG_NOT_REPRODUCED
    if any(s.status == "regression" for s in v.suites):
        return "regression", Exit.REGRESSION
    after_ok = (bool(v.after) and all(c.holds for c in v.after)
                and all(t.count("failed") == 0 and t.count("error") == 0 and t.count("passed") > 0 for t in v.tests))
    if not after_ok:
        return "not-fixed", Exit.NOT_FIXED
    if v.already_fixed:
        return "already-fixed", Exit.ALREADY_FIXED
    return "fixed", Exit.OK


def summary_table(v: Verdict) -> str:
    rows = [("check", "expect", "result")]
    for c in v.before + v.after:
        rows.append((c.name, c.expect, f"{'ok' if c.holds else 'FAIL'} (exit {c.exit_code}, pattern {c.pattern})"))
    for t in v.tests:
        counts = ", ".join(f"{n} {k}" for k, n in t.counts.items() if n)
        rows.append((t.name, "all pass", f"{'ok' if t.exit_code == 0 else 'FAIL'} ({counts or 'nothing ran'})"))
    for s in v.suites:
        rows.append((f"{s.name} [{s.tier}]", "no regression",
                     f"{'ok' if s.status == 'ok' else s.status.upper()} ({len(s.files)} files; before {_c(s.before)}; "
                     f"after {_c(s.after)}; regressions {len(s.regressions)}, pre-existing {len(s.pre_existing)}, "
                     f"flaky {len(s.flaky)}, fixed {len(s.fixed)}, not collectable {len(s.not_collectable)})"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [line for s in v.suites for line in s.describe()[1:]]
    head = f"{v.env}: DeepSpeed {v.deepspeed_before or '?'} -> {v.deepspeed_after or '?'} ({v.backend})"
    tail = f"outcome: {v.outcome} (exit {v.exit_code})" + (f": {v.error}" if v.error else "")
    warnings = [f"WARNING: {w['message']}" for w in v.client_warnings]
    return "\n".join([head, *lines, *notes, tail, *warnings])


def _c(counts: dict[str, int]) -> str:
    return "/".join(f"{n} {k}" for k, n in counts.items() if n) or "none"
