"""The kept training-effect runs (docs/figures/) agree with the scale rule, step by step; the figure is theirs."""

from __future__ import annotations

import pytest

from repro.training import report as expect
from repro.training.report import RECIPES, STAGES, STEPS, TOLERANCES, TrainingReport
from tests.conftest import ROOT

FIGURES = ROOT / "docs" / "figures"


@pytest.fixture(scope="module")
def reports() -> dict[str, TrainingReport]:
    # load() validates every field and recomputes holds / pattern from the steps.
    return {name: TrainingReport.load(FIGURES / f"training_effect-{name}.json") for name in ("unpatched", "patched")}


def test_each_run_sits_at_the_rules_factor_of_the_true_gradient_on_every_step(reports):
    for name, expectation in (("unpatched", "buggy"), ("patched", "fixed")):
        report = reports[name]
        assert report.deepspeed_fixed == (name == "patched") and report.sp == 2
        assert {(r.stage, r.recipe) for r in report.runs} == {(s, r) for s in STAGES for r in RECIPES}
        assert all(len(r.steps) == len(report.reference) == STEPS for r in report.runs)
        assert report.holds and report.pattern == expectation, report.table()


def _runs(report: TrainingReport) -> dict:
    return {(r.stage, r.recipe): [s.grad_norm for s in r.steps] for r in report.runs}


def fix_factor(stage: int, recipe: str, sp: int) -> float:
    """What the fix multiplies a run's gradient by: the rule with the fix over the rule without it."""
    return expect.expected_factor(stage, recipe, sp, "fixed") / expect.expected_factor(stage, recipe, sp, "buggy")


def pair_errors(unpatched: TrainingReport, patched: TrainingReport) -> dict:
    """Per run, max over steps of |(patched / unpatched gradient norm) / fix_factor - 1|: one run on both builds."""
    before, after = _runs(unpatched), _runs(patched)
    return {
        key: max(abs(a / b / fix_factor(*key, unpatched.sp) - 1.0) for a, b in zip(after[key], before[key]))
        for key in before
    }


def test_the_fix_multiplies_zero3_by_sp_and_leaves_zero2_alone(reports):
    assert {
        (s, r): fix_factor(s, r, 2)
        for s in STAGES
        for r in RECIPES
    } == {
        (2, "allgather"): 1.0,
        (2, "own_share"): 1.0,
        (3, "allgather"): 2.0,
        (3, "own_share"): 2.0
    }
    errors = pair_errors(reports["unpatched"], reports["patched"])
    assert all(err <= TOLERANCES["grad_norm_rel_tol"] for err in errors.values()), errors


def test_the_pair_check_fails_on_swapped_builds(reports):
    errors = pair_errors(reports["patched"], reports["unpatched"])
    assert errors[(3, "own_share")] > 0.5 and errors[(3, "allgather")] > 0.5


def test_deepspeeds_own_norm_is_the_norm_of_the_gradient_it_steps_with(reports):
    # What gradient clipping and logging see carries the same factor.
    for report in reports.values():
        for run in report.runs:
            assert all(abs(s.ds_grad_norm / s.grad_norm - 1) < 1e-6 for s in run.steps), (run.stage, run.recipe)


def test_the_figure_is_kept_beside_its_data():
    assert (FIGURES / "training_effect.png").stat().st_size > 10_000
