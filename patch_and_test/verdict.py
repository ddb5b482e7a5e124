"""The pipeline's verdict: every step's result, one outcome, one exit code. Pure logic.

Outcome rules (exit code in brackets, see errors.Exit):
* ``skipped`` [77]: a reproducer could not run here (e.g. nccl without the GPUs).
* ``error`` [2]: a check could not run (crash, deadline).
* ``bug-not-reproduced`` [3]: unpatched, a reproducer did not show exactly the known pattern.
* ``already-fixed`` [5]: the tree carried the fix before we touched it; the "after" checks ran.
* ``not-fixed`` [1]: patched, a reproducer, the twin test or the upstream regression test
  still fails, or an upstream suite has a test that passed before the series and fails after.
* ``fixed`` [0]: the bug was seen before and is gone after, on every check.
Tests of an upstream suite that fail both before and after are pre-existing: they are
reported, and they do not change the outcome.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from patch_and_test.checks import PytestCheck, ReproCheck
from patch_and_test.errors import Exit

SCHEMA = "zero3-sp-gradfix/verdict/v1"


@dataclasses.dataclass
class Step:
    name: str
    status: str  # "ok" | "failed" | "skipped" | "error" | "warning" (a check that warns, never fails the job)
    detail: str
    duration_s: float = 0.0
    log: str | None = None


@dataclasses.dataclass
class SuiteComparison:
    """An upstream suite run before and after the series: what changed, test by test."""

    name: str
    before: dict[str, int]
    after: dict[str, int]
    regressions: list[str]  # passed before, failed after
    fixed: list[str]  # failed before, passed after
    pre_existing: list[str]  # failed before and after


def compare_suites(name: str, before: PytestCheck, after: PytestCheck) -> SuiteComparison:
    bad = ("failed", "error")
    b, a = before.outcomes, after.outcomes
    return SuiteComparison(
        name=name, before=before.counts, after=after.counts,
        regressions=sorted(t for t, o in a.items() if o in bad and b.get(t) == "passed"),
        fixed=sorted(t for t, o in a.items() if o == "passed" and b.get(t) in bad),
        pre_existing=sorted(t for t, o in a.items() if o in bad and b.get(t) in bad))


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
    suites: list[SuiteComparison]  # upstream suites run before and after
    already_fixed: bool = False
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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)


def decide(v: Verdict) -> tuple[str, Exit]:
    if v.error is not None:
        code = Exit(v.error_exit if v.error_exit is not None else Exit.ERROR)
        return {Exit.SKIPPED: "skipped", Exit.SERIES_DOES_NOT_APPLY: "series-does-not-apply",
                Exit.ALREADY_FIXED: "already-fixed"}.get(code, "error"), code
    checks = [*v.before, *v.after]
    if any(c.exit_code == 77 for c in checks):
        return "skipped", Exit.SKIPPED
    tests_broken = any(t.exit_code not in (0, 1) or not t.outcomes for t in v.tests)
    if any(c.exit_code not in (0, 1) for c in checks) or tests_broken:
        return "error", Exit.ERROR
    if not v.already_fixed and (not v.before or not all(c.holds for c in v.before)):
        return "bug-not-reproduced", Exit.BUG_NOT_REPRODUCED
    after_ok = (bool(v.after) and all(c.holds for c in v.after)
                and all(t.count("failed") == 0 and t.count("error") == 0 and t.count("passed") > 0 for t in v.tests)
                and not any(s.regressions for s in v.suites))
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
        rows.append((s.name, "no regression", f"{'ok' if not s.regressions else 'FAIL'} (before {_c(s.before)}; "
                     f"after {_c(s.after)}; pre-existing failures {len(s.pre_existing)})"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = f"{v.env}: DeepSpeed {v.deepspeed_before or '?'} -> {v.deepspeed_after or '?'} ({v.backend})"
    tail = f"outcome: {v.outcome} (exit {v.exit_code})" + (f": {v.error}" if v.error else "")
    warnings = [f"WARNING: {w['message']}" for w in v.client_warnings]
    return "\n".join([head, *lines, tail, *warnings])


def _c(counts: dict[str, int]) -> str:
    return "/".join(f"{n} {k}" for k, n in counts.items() if n) or "none"
