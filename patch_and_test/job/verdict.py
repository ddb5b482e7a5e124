"""The pipeline's verdict: every step's result, one outcome, one exit code. Pure logic.

Outcome rules (each outcome's exit code and meaning: ``errors.Exit``):
* ``skipped``: a reproducer could not run here (e.g. nccl without the GPUs).
* ``error``: a check could not run (crash, deadline).
* ``bug-not-reproduced``: unpatched, a reproducer did not show exactly the known pattern.
* ``already-fixed``: the tree carried the fix before we touched it; the "after" checks ran.
* ``regression``: a DeepSpeed test the series can reach (``affected``) passed before the
  series and fails after, on every rerun, or a test the series adds fails.
* ``not-fixed``: patched, a reproducer, the twin test or the upstream regression test
  still fails.
* ``fixed``: the bug was seen before and is gone after, on every check.
An upstream suite whose run crashed, hit its deadline, or collected fewer tests after than
before is an ``error``, never "no regressions". Its tests that fail both before and after
are pre-existing, and a test that failed once and passed on a rerun is flaky: both are
reported, and neither changes the outcome.

``Verdict`` is a pydantic v2 model on the reports' base (``repro.harness.report.JsonReport``):
``write`` gives ``results/<env>/verdict.json`` with ``outcome`` and ``exit_code`` included, and
``Verdict.load`` / ``from_dict`` validate a file read back (no unknown key, every check typed) and
reject one whose stored outcome or exit code is not what ``decide`` gives from its own checks. Its
JSON schema is ``docs/schemas/verdict.schema.json`` (``python -m patch_and_test.schemas``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, computed_field

from patch_and_test.upstream.affected import Selection
from patch_and_test.core.checks import PytestCheck, ReproCheck
from patch_and_test.core.errors import Exit
from patch_and_test.upstream.suite import SuiteComparison
from repro.harness.report import JsonReport, Record

SCHEMA = "zero3-sp-gradfix/verdict/v1"
Outcome = Literal["fixed", "not-fixed", "bug-not-reproduced", "regression", "already-fixed", "skipped", "error",
                  "series-does-not-apply"]
STEP_FIELDS = ("name", "status", "detail", "duration_s", "log")


class Step(Record):
    """One step of the run, as the pipeline printed it (``Step(name, status, detail, duration_s, log)``)."""

    name: str
    status: Literal["ok", "failed", "skipped", "error",
                    "warning"] = Field(description='"warning": a check that warns, never fails the job')
    detail: str
    duration_s: float = 0.0
    log: str | None = None

    def __init__(self, *args: Any, **data: Any) -> None:
        if len(args) > len(STEP_FIELDS):
            raise TypeError(f"Step takes at most {len(STEP_FIELDS)} positional arguments ({len(args)} given)")
        given = dict(zip(STEP_FIELDS, args))
        if both := sorted(given.keys() & data.keys()):
            raise TypeError(f"Step got multiple values for {', '.join(both)}")
        super().__init__(**given, **data)


class Verdict(JsonReport):
    """``results/<env>/verdict.json``: every step and check of one run; ``outcome`` and ``exit_code`` derived."""

    SCHEMA: ClassVar[str] = SCHEMA

    env: str
    source: dict[str, Any] = Field(description="where the DeepSpeed tree came from (patch_and_test.core.source)")
    series: dict[str, Any] | None = Field(description="the series chosen for the tree, what applied and what not")
    deepspeed_before: str | None
    deepspeed_after: str | None
    backend: str
    steps: list[Step]
    before: list[ReproCheck]
    after: list[ReproCheck]
    tests: list[PytestCheck] = Field(description="run once, after the series (twin, upstream regression test)")
    suites: list[SuiteComparison] = Field(description="DeepSpeed's tests the series can reach, run before and after")
    already_fixed: bool = False
    affected: Selection | None = Field(None, description="the DeepSpeed test files the series can reach, and why")
    inputs: dict[str, Any] = Field(default_factory=dict, description="content hashes (patch_and_test.core.inputs)")
    environment: dict[str, Any] = Field(default_factory=dict)
    wall_time_s: float | None = None
    client_warnings: list[dict[str, Any]] = Field(
        default_factory=list,
        description="installed clients (transformers, ...) whose sp gradients the downstream rule says are mis-scaled "
        "with the patched build (patch_and_test.downstream.clients): warnings, not failures of the fix")
    error: str | None = Field(None, description="a PipelineError's one-line message, when one ended the run")
    error_exit: Exit | None = Field(None, description="the PipelineError's exit code")

    @computed_field(description="decided by patch_and_test.job.verdict.decide (see its module docstring)")
    @property
    def outcome(self) -> Outcome:
        return decide(self)[0]

    @computed_field(description="the job's exit code for the outcome (patch_and_test.core.errors.Exit)")
    @property
    def exit_code(self) -> int:
        return int(decide(self)[1])


def decide(v: Verdict) -> tuple[Outcome, Exit]:
    if v.error is not None:
        code = Exit(v.error_exit if v.error_exit is not None else Exit.ERROR)
        return {
            Exit.SKIPPED: "skipped",
            Exit.SERIES_DOES_NOT_APPLY: "series-does-not-apply",
            Exit.ALREADY_FIXED: "already-fixed"
        }.get(code, "error"), code
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
