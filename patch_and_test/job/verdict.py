"""The pipeline's verdict: every step's result, one outcome, one exit code. Pure logic.

Outcome rules (each outcome's exit code and meaning: ``errors.Exit``):
* ``skipped``: a reproducer could not run here (e.g. nccl without the GPUs).
* ``error``: a check could not run (crash, deadline), or an upstream suite crashed, hit its deadline or collected
  fewer tests after than before (never "no regressions").
* ``bug-not-reproduced``: unpatched, a reproducer did not show exactly the known pattern.
* ``regression``: a DeepSpeed test the series can reach passed before and fails after on every rerun, or a test
  the series adds fails (tests failing before and after are pre-existing, one passing on a rerun flaky: both
  reported, neither changes the outcome).
* ``not-fixed``: patched, a reproducer, the twin test or the upstream regression test still fails.
* ``already-fixed``: the tree carried the fix before we touched it; the "after" checks ran.
* ``fixed``: the bug was seen before and is gone after, on every check.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, PrivateAttr, computed_field, model_validator

from patch_and_test.core.checks import PytestCheck, ReproCheck, ended_early
from patch_and_test.core.errors import Exit
from patch_and_test.core.inputs import RunInputs
from patch_and_test.core.series import ChosenSeries
from patch_and_test.core.source import SourceRecord
from patch_and_test.core.templating import counts
from patch_and_test.downstream.clients import ClientWarning
from patch_and_test.upstream.affected import Selection
from patch_and_test.upstream.suite import SuiteComparison
from repro.harness.env import HostEnvironment
from repro.harness.report import JsonReport, Record, text_table

SCHEMA = "zero3-sp-gradfix/verdict/v1"
Outcome = Literal["fixed", "not-fixed", "bug-not-reproduced", "regression", "already-fixed", "skipped", "error",
                  "series-does-not-apply"]


class Step(Record):
    """One step of the run, as the pipeline printed it."""

    name: str
    status: Literal["ok", "failed", "skipped", "error",
                    "warning"] = Field(description='"warning": a check that warns, never fails the job')
    detail: str
    duration_s: float = 0.0
    log: str | None = None


class Verdict(JsonReport):
    """``results/<env>/verdict.json``: every step and check of one run; ``outcome`` and ``exit_code`` derived."""

    # Validated once, when the run ends (or a file is read): the outcome is decided then, not on each assignment.
    model_config = ConfigDict(validate_assignment=False)
    SCHEMA: ClassVar[str] = SCHEMA

    env: str
    source: SourceRecord | None = Field(description="where the DeepSpeed tree came from (None: the run ended first)")
    series: ChosenSeries | None = Field(description="the series chosen for the tree, what applied and what not")
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
    inputs: RunInputs | None = Field(None, description="content hashes (None: the run ended before they were known)")
    environment: HostEnvironment | None = None
    wall_time_s: float | None = None
    client_warnings: list[ClientWarning] = Field(
        default_factory=list,
        description="installed clients (transformers, ...) whose sp gradients the downstream rule says are mis-scaled "
        "with the patched build (patch_and_test.downstream.clients): warnings, not failures of the fix")
    error: str | None = Field(None, description="a PipelineError's one-line message, when one ended the run")
    error_exit: Exit | None = Field(None, description="the PipelineError's exit code")
    _decision: tuple[Outcome, Exit] = PrivateAttr()

    @classmethod
    def from_draft(cls, draft: Verdict) -> Verdict:
        """The pipeline's draft (``Verdict.model_construct``, filled in step by step) validated: decided."""
        return cls.model_validate({k: getattr(draft, k) for k in cls.model_fields if k != "schema_name"})

    @model_validator(mode="after")
    def _decided(self) -> Verdict:
        self._decision = decide(self)
        return self

    @computed_field(description="decided by patch_and_test.job.verdict.decide (see its module docstring)")
    @property
    def outcome(self) -> Outcome:
        return self._decision[0]

    @computed_field(description="the job's exit code for the outcome (patch_and_test.core.errors.Exit)")
    @property
    def exit_code(self) -> int:
        return int(self._decision[1])


def decide(v: Verdict) -> tuple[Outcome, Exit]:
    if v.error is not None:
        return ended_early(v.error_exit)
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
                and all(t.counts["failed"] == t.counts["error"] == 0 < t.counts["passed"] for t in v.tests))
    if not after_ok:
        return "not-fixed", Exit.NOT_FIXED
    if v.already_fixed:
        return "already-fixed", Exit.ALREADY_FIXED
    return "fixed", Exit.OK


def summary_table(v: Verdict) -> str:
    rows = [(c.name, c.expect, f"{'ok' if c.holds else 'FAIL'} (exit {c.exit_code}, pattern {c.pattern})")
            for c in v.before + v.after]
    rows += [(t.name, "all pass", f"{'ok' if t.exit_code == 0 else 'FAIL'} ({counts(t.counts, 'nothing ran')})")
             for t in v.tests]
    rows += [(f"{s.name} [{s.depth}]", "no regression",
              f"{'ok' if s.status == 'ok' else s.status.upper()} ({len(s.files)} files; before {counts(s.before)}; "
              f"after {counts(s.after)}; regressions {len(s.regressions)}, pre-existing {len(s.pre_existing)}, "
              f"flaky {len(s.flaky)}, fixed {len(s.fixed)}, not collectable {len(s.not_collectable)})")
             for s in v.suites]
    notes = [line for s in v.suites for line in s.describe()[1:]]
    head = f"{v.env}: DeepSpeed {v.deepspeed_before or '?'} -> {v.deepspeed_after or '?'} ({v.backend})"
    tail = f"outcome: {v.outcome} (exit {v.exit_code})" + (f": {v.error}" if v.error else "")
    warnings = [f"WARNING: {w.message}" for w in v.client_warnings]
    return "\n".join([head, *text_table(("check", "expect", "result"), rows), *notes, tail, *warnings])
