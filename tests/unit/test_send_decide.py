"""send's verdict on a finished run (``review.send.decide``): send only when the regression test failed without the
fix and passes with it and no DeepSpeed test regressed. Built from the kept newest-upstream run (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patch_and_test.core.errors import Exit
from patch_and_test.review.send import EXITS, decide
from patch_and_test.upstream.job import AffectedVerdict

KEPT = Path(__file__).resolve().parents[2] / "docs" / "affected-results" / "newest-upstream" / "affected.json"
REGRESSION = "::TestZero3SequenceParallelGradientScale::"


@pytest.fixture
def kept() -> AffectedVerdict:
    return AffectedVerdict.load(KEPT)


def _partial(verdict: AffectedVerdict, outcome: str) -> AffectedVerdict:
    runs = [
        r.model_copy(update={"outcomes": {
            t: outcome
            for t in r.outcomes
        }}) if "regression" in r.name else r for r in verdict.partial
    ]
    return verdict.model_copy(update={"partial": runs})


def _after(verdict: AffectedVerdict, test_part: str, outcome: str, category: str) -> AffectedVerdict:
    suite = verdict.suite
    results = [
        r.model_copy(update={
            "after": outcome,
            "category": category
        }) if test_part in r.test else r for r in suite.results
    ]
    regressions = [r.test for r in results if r.category in ("regression", "new-failed")]
    status = "regression" if regressions else suite.status
    return verdict.model_copy(
        update={"suite": suite.model_copy(update={
            "results": results,
            "status": status,
            "regressions": regressions
        })})


def test_the_kept_run_is_fit_to_send(kept):
    code, why = decide(kept)
    assert code == Exit.OK and "failed without the fix, passes with it" in why


def test_a_regression_test_that_passes_without_the_fix_shows_no_bug(kept):
    assert decide(_partial(kept, "passed"))[0] == Exit.BUG_NOT_REPRODUCED
    assert decide(kept.model_copy(update={"partial": []}))[0] == Exit.BUG_NOT_REPRODUCED  # never ran alone


def test_a_regression_test_that_fails_with_the_series_is_not_fixed(kept):
    assert decide(_after(kept, REGRESSION, "failed", "new-failed"))[0] == Exit.NOT_FIXED


def test_a_regressed_deepspeed_test_is_a_regression(kept):
    code, why = decide(_after(kept, "test_elastic_checkpoint_is_deprecated_for_zero3", "failed", "regression"))
    assert code == Exit.REGRESSION and "test_elastic_checkpoint_is_deprecated_for_zero3" in why


def test_a_run_that_crashed_or_ended_early_is_an_error(kept):
    crashed = kept.model_copy(update={"suite": kept.suite.model_copy(update={"status": "error", "errors": ["boom"]})})
    assert decide(crashed) == (Exit.ERROR, "boom")
    assert decide(kept.model_copy(update={"error": "series does not apply", "error_exit": 4}))[0] == 4


def test_every_exit_code_send_gives_is_documented():
    assert set(EXITS) == set(Exit) - {Exit.SKIPPED}
