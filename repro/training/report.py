"""The training-effect run's space, per-step records and verdict: every run's gradient norm at the rule's factor of
the reference's on every step (AdamW without clipping: a constant scale shows in the norm, not in the loss)."""

from __future__ import annotations

import dataclasses
import math

from pydantic import Field

from repro.alst.expect import RECIPES as RECIPES, STAGES as STAGES  # re-exported
from repro.harness import scales
from repro.harness.report import PatternReport, Record, text_table

TOLERANCES = scales.TOLERANCES["training"]
STEPS = 30
LR = 1e-3
EPS = 1e-8


def expected_factor(stage: int, recipe: str, sp: int, expect: str) -> float:
    """The rule for a run on the stage's default config (ZeRO-3: ``__avg_scatter_grads``)."""
    return scales.expected_scale(scales.default_path(stage), sp, expect, recipe=recipe)


@dataclasses.dataclass(frozen=True)
class RunCheck:
    factor: float  # what the rule predicts
    first_ratio_err: float  # |ratio / factor - 1| on step 0
    worst_ratio_err: float  # max over steps of |ratio / factor - 1|
    worst_loss_err: float  # max over steps of |loss / reference loss - 1|

    @property
    def ok(self) -> bool:
        return (self.first_ratio_err <= TOLERANCES["step0_rel_tol"]
                and self.worst_ratio_err <= TOLERANCES["grad_norm_rel_tol"]
                and self.worst_loss_err <= TOLERANCES["loss_rel_tol"])


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


class TrainingReport(PatternReport):
    """The training-effect report: the reference's and each (stage, recipe) run's steps; holds: every run at the rule's
    factor of the reference on every step."""

    SCHEMA = "zero3-sp-gradfix/training-effect-report/v1"

    deepspeed_fixed: bool = Field(description="read from the installed DeepSpeed's code")
    marker: bool = Field(description="read from the installed DeepSpeed's code")
    transformers_version: str
    reference: list[StepRecord] = Field(description="per step: plain torch, no sequence parallelism")
    runs: list[TrainingRun] = Field(description="per (stage, recipe): its steps")

    def versions(self) -> str:
        return f"{super().versions()}, transformers {self.transformers_version}"

    def check(self, run: TrainingRun, expect: str) -> RunCheck:
        factor = expected_factor(run.stage, run.recipe, self.sp, expect)
        if len(run.steps) != len(self.reference):
            raise ValueError(f"{len(run.steps)} steps against a reference of {len(self.reference)}")
        errs = [abs(s.grad_norm / ref.grad_norm / factor - 1.0) for s, ref in zip(run.steps, self.reference)]
        loss_err = max((abs(s.loss / ref.loss - 1.0) for s, ref in zip(run.steps, self.reference)), default=math.inf)
        return RunCheck(factor, errs[0] if errs else math.inf, max(errs, default=math.inf), loss_err)

    def where(self, expect: str) -> bool:
        return bool(self.runs) and all(self.check(r, expect).ok for r in self.runs)

    def table(self) -> str:
        header = ("stage", "recipe", "paths", "grad norm / reference (first, last)", "rule", "step-0 err", "worst err",
                  "verdict")
        lines = []
        for r in self.runs:
            c = self.check(r, self.expect)
            first, last = (r.steps[i].grad_norm / self.reference[i].grad_norm for i in (0, -1))
            lines.append((f"zero{r.stage}", r.recipe, ", ".join(f"{k} x{v}" for k, v in r.reduce_paths.items()),
                          f"{first:.5f}, {last:.5f}", scales.label(c.factor), f"{c.first_ratio_err:.1e}",
                          f"{c.worst_ratio_err:.1e}", "ok" if c.ok else "MISMATCH"))
        return "\n".join(text_table(header, lines) + ["", self.summary()])
