"""The training-effect run's report: per-step records of the reference and of each engine; the verdict. Pure logic."""

from __future__ import annotations

from typing import ClassVar

from pydantic import computed_field

from repro.harness import scales
from repro.harness.report import LaunchReport, Record, text_table
from repro.training import expect

SCHEMA = "zero3-sp-gradfix/training-effect-report/v1"


class StepRecord(Record):
    step: int
    loss: float  # the full-sequence loss
    grad_norm: float  # L2 norm over every parameter of the gradient the optimizer steps with (float64)
    ds_grad_norm: float | None = None  # what DeepSpeed reports (get_global_grad_norm); None for the reference


class TrainingRun(Record):
    stage: int
    recipe: str  # "allgather" | "own_share"
    reduce_paths: dict[str, int]  # reduce path -> parameters that took it (observed for ZeRO-3)
    steps: list[StepRecord]


class TrainingReport(LaunchReport):
    """JSON schema ``zero3-sp-gradfix/training-effect-report/v1``: the launch's fields, plus

    deepspeed_fixed, marker   bool  read from the installed DeepSpeed's code
    transformers_version      str
    reference                 list  StepRecord per step: plain torch, no sequence parallelism
    runs                      list  TrainingRun per (stage, recipe): StepRecord per step
    holds                     bool  every run at the rule's factor on every step (``repro.training.expect``)
    pattern                   str   "fixed" | "buggy" | "other": which expectation every run matches
    exit_code                 int   0 holds, 1 does not
    """

    SCHEMA: ClassVar[str] = SCHEMA

    deepspeed_fixed: bool
    marker: bool
    transformers_version: str
    reference: list[StepRecord]
    runs: list[TrainingRun]

    def check(self, run: TrainingRun, expect_: str) -> expect.RunCheck:
        return expect.check_run(run.stage, run.recipe, self.sp, expect_, [s.grad_norm for s in run.steps],
                                [s.loss for s in run.steps], [s.grad_norm for s in self.reference],
                                [s.loss for s in self.reference])

    @computed_field
    @property
    def holds(self) -> bool:
        return bool(self.runs) and all(self.check(r, self.expect).ok for r in self.runs)

    @computed_field
    @property
    def pattern(self) -> str:
        for e in ("fixed", "buggy"):
            if self.runs and all(self.check(r, e).ok for r in self.runs):
                return e
        return "other"

    @computed_field
    @property
    def exit_code(self) -> int:
        return 0 if self.holds else 1

    def versions(self) -> str:
        return f"{super().versions()}, transformers {self.transformers_version}"

    def table(self) -> str:
        header = ("stage", "recipe", "paths", "grad norm / reference (first, last)", "rule", "step-0 err", "worst err",
                  "verdict")
        lines = []
        for r in self.runs:
            c = self.check(r, self.expect)
            first, last = (s.grad_norm / ref.grad_norm
                           for s, ref in ((r.steps[0], self.reference[0]), (r.steps[-1], self.reference[-1])))
            lines.append((f"zero{r.stage}", r.recipe, ", ".join(f"{k} x{v}" for k, v in r.reduce_paths.items()),
                          f"{first:.5f}, {last:.5f}", scales.label(c.factor), f"{c.first_ratio_err:.1e}",
                          f"{c.worst_ratio_err:.1e}", "ok" if c.ok else "MISMATCH"))
        return "\n".join(text_table(header, lines) + ["", self.summary()])


emit = TrainingReport.emit
