"""README's opening table: per way the loss reaches DeepSpeed, its gradient factor today and with the fix alone.

Every factor is measured: a census library's kept ``tox -m downstream`` reports (its own code,
``census.measured_factors``), or, for a library measured by no run of its own code and for a user's own loss, step 0
of the kept training-effect runs of its recipe (``docs/figures/training_effect-{unpatched,patched}.json``). A factor
that is not a simple fraction (``scales.label``), that the report's own check does not hold for, or that is not
the rule's (``census.read_factors``) is an error, as is advice written for another verdict than the factors give.
``zero3-sp docs`` puts the table between README's marker lines; tests/unit/test_stack_table.py checks it is current.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core import templating
from patch_and_test.core.templating import Model
from patch_and_test.downstream.census import (CENSUS, Census, Factor, Library, StageFactors, Verdict, measured_factors,
                                              read_factors, verdict)
from patch_and_test.downstream.table import KEPT_RESULTS, PHASES
from repro.downstream.expect import STAGES, ClientKind
from repro.harness import scales
from repro.training.report import TrainingReport

DOCUMENT = PACKAGE_ROOT / "README.md"
FIGURES = PACKAGE_ROOT / "docs" / "figures"  # training_effect-{unpatched,patched}.json
TRAINING = "training_effect-{phase}.json"
BEGIN = "<!-- stack-table:begin (rendered by zero3-sp docs from the kept runs; do not edit) -->"
END = "<!-- stack-table:end -->"
MAX_LINE = 40  # the block ends within README's first 40 lines
BACKPORT = "[more](docs/backport-clients.md)"
HOW = "([how](docs/downstream-notice.md#what-they-should-do))"
FIX_ONLY_WITH_TF_PATCH = ("take the fix only with `patches/downstream/transformers` (it reads the capability "
                          f"marker) {BACKPORT}")


@dataclasses.dataclass(frozen=True)
class Stack:
    """One way the loss reaches DeepSpeed: a census library (by label) or a recipe of the user's own; ``advice`` is
    written for the census verdict ``written_for`` (the factors must give it)."""
    label: str
    advice: str
    written_for: Verdict
    library: Optional[str] = None
    recipe: Optional[ClientKind] = None


STACKS = (
    Stack("transformers 5.0-5.24", "ZeRO-3: nothing today; before taking the fix (and for ZeRO-1/2 now): "
          "transformers 5.25, next row", "must change with it", library="transformers 5.24"),
    Stack("transformers 5.25", f"nothing today; {FIX_ONLY_WITH_TF_PATCH}", "must change with it",
          library="transformers 5.25"),
    Stack("trl", f"as transformers 5.25 (trl hands its loss to transformers' Trainer): {FIX_ONLY_WITH_TF_PATCH}",
          "must change with it", library="trl"),
    Stack("ArcticTraining", f"change `SFTTrainer.loss` to each rank's own share, then take the fix {BACKPORT}",
          "must change with it", library="arctic-training"),
    Stack("accelerate's example (its ALST script: the differentiable all_gather)",
          "change the script's loss to each rank's own share, then take the fix", "must change with it",
          library="accelerate"),
    Stack("axolotl", f"take the fix (it divides transformers' loss by sp); keep its pinned transformers {BACKPORT}",
          "gains from the fix", library="axolotl"),
    Stack("your own loss: all_gather (differentiable)", f"change the loss to each rank's own share {HOW}: right on "
          "every stage, with or without the fix", "must change with it", recipe=ClientKind(kind="allgather")),
    Stack("your own loss: each rank's own share", "take the fix", "gains from the fix",
          recipe=ClientKind(kind="own_share")),
)


class StackRow(Model):
    label: str
    advice: str
    stages: list[StageFactors]  # ZeRO-2 and ZeRO-3, unpatched and patched
    source: str  # the kept files, as a Markdown link

    def factor(self, stage: int, phase: str) -> str:
        return getattr(next(s for s in self.stages if s.stage == stage), phase).label


def training_factors(recipe: ClientKind, figures: Path, sp: int, deepspeed_version: str) -> list[StageFactors]:
    """Step 0 of the kept training-effect runs of ``recipe``: each run's gradient norm over the reference's."""
    if recipe.gate != "none" or recipe.divides_by_sp:
        raise ValueError(f"no training-effect run measures {recipe}")
    by_phase = {}
    for phase in PHASES:
        path = figures / TRAINING.format(phase=phase)
        report = TrainingReport.load(path)
        if report.deepspeed_fixed != (phase == "patched") or report.marker != report.deepspeed_fixed \
                or report.sp != sp or report.deepspeed_version.split("+")[0] != deepspeed_version:
            raise ValueError(f"{path}: not DeepSpeed {deepspeed_version} {phase} (with its marker) at sp={sp}")
        runs = {r.stage: r for r in report.runs if r.recipe == recipe.kind}
        if set(runs) != set(STAGES):
            raise ValueError(f"{path}: no ZeRO-2 and ZeRO-3 runs of the {recipe.kind} recipe")
        expect = "fixed" if report.deepspeed_fixed else "buggy"
        by_phase[phase] = {}
        for stage, run in runs.items():  # matches_rule: the report's check of every step
            ratio = run.steps[0].grad_norm / report.reference[0].grad_norm
            by_phase[phase][stage] = Factor(value=ratio, label=scales.label(ratio), measured=True,
                                            matches_rule=report.check(run, expect).ok)
    return [StageFactors(stage=s, **{phase: by_phase[phase][s] for phase in PHASES}) for s in STAGES]


def _checked(stack: Stack, recipe: ClientKind, stages: list[StageFactors], census: Census) -> list[StageFactors]:
    """``stages``, if every measured factor is a simple fraction, holds its report's check and is the rule's."""
    rule = {s.stage: s for s in read_factors(recipe, census.sp, census.deepspeed_version)}
    for s in stages:
        for phase in PHASES:
            got, want = getattr(s, phase), getattr(rule[s.stage], phase)
            if got.label == "other" or got.label != want.label or not got.matches_rule:
                raise ValueError(f"{stack.label}: ZeRO-{s.stage} {phase} measured {got.value!r} "
                                 f"(label {got.label}, the report's check {got.matches_rule}); the rule says "
                                 f"{want.label}")
    if verdict(stages) != stack.written_for:
        raise ValueError(f"{stack.label}: its advice is written for {stack.written_for!r}, "
                         f"the factors give {verdict(stages)!r}")
    return stages


def stack_row(stack: Stack, census: Census, results: Path, figures: Path) -> StackRow:
    lib: Optional[Library] = next((x for x in census.libraries if x.label == stack.library), None)
    if stack.library is not None and (lib is None or lib.recipe is None):
        raise ValueError(f"{stack.label}: the census has no library {stack.library!r} with a recipe")
    recipe = lib.recipe if lib is not None else stack.recipe
    if lib is not None and lib.measured is not None:
        where = lib.measured
        stages = measured_factors(where, recipe, results, census.sp)
        source = f"{where.client} {where.client_version}: [{where.env}](docs/downstream-results/{where.env}/)"
    else:
        stages = training_factors(recipe, figures, census.sp, census.deepspeed_version)
        source = f"its `{recipe.kind}` runs, step 0: [{TRAINING.format(phase='*')}](docs/figures/)"
    return StackRow(label=stack.label, advice=stack.advice, stages=_checked(stack, recipe, stages, census),
                    source=source)


def render(census_file: Path = CENSUS, results: Path = KEPT_RESULTS, figures: Path = FIGURES) -> str:
    """The table and its notes (no markers); ValueError when a kept file does not support a cell."""
    census = Census.load(census_file)
    rows = [stack_row(s, census, results, figures) for s in STACKS]
    return templating.render("stack_table.md.j2", census=census, rows=rows).rstrip("\n")
