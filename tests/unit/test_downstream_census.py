"""The downstream census (patch_and_test.downstream.census): its data, its factors, its verdicts, its table."""

from __future__ import annotations

import pytest

from patch_and_test import PACKAGE_ROOT
from patch_and_test.downstream.census import (BEGIN, CENSUS, END, Census, Factor, Library, StageFactors, read_factors,
                                              render, rows, verdict)
from patch_and_test.core.templating import block_of
from patch_and_test.downstream.table import KEPT_RESULTS
from tests.unit.test_downstream_expect import _report, _row
from repro.downstream.expect import ClientKind


def _stage(stage, before, after):
    return StageFactors(stage=stage, unpatched=Factor(value=float(eval(before)), label=before, measured=False),
                        patched=Factor(value=float(eval(after)), label=after, measured=False))


@pytest.mark.parametrize(
    "z2, z3, want",
    [
        (("2", "2"), ("1", "2"), "must change with it"),  # the all_gather recipe (transformers 5.24, ArcticTraining)
        (("1", "1"), ("1", "2"), "must change with it"),  # transformers 5.25's version gate
        (("1", "1"), ("1/2", "1"), "gains from the fix"),  # axolotl on transformers 5.20.1
        (("1", "1"), ("1", "1"), "untouched"),  # the proposed transformers change
    ])
def test_verdict_follows_from_the_factors(z2, z3, want):
    assert verdict([_stage(2, *z2), _stage(3, *z3)]) == want


def test_read_factors_are_the_rule_on_the_recipe():
    got = read_factors(ClientKind(kind="allgather"), 2, "0.19.8")
    assert {s.stage: (s.unpatched.label, s.patched.label) for s in got} == {2: ("2", "2"), 3: ("1", "2")}
    axolotl = read_factors(ClientKind(kind="allgather", divides_by_sp=True), 2, "0.19.8")
    assert {s.stage: (s.unpatched.label, s.patched.label) for s in axolotl} == {2: ("1", "1"), 3: ("1/2", "1")}
    assert not any(s.unpatched.measured for s in axolotl)


def _library(**kw):
    base = dict(label="x", distribution="x", version="1.0", newest="1.0", requires_python=">=3.10", drives_sp=True,
                how="h", evidence=[], loss="l", gate="-")
    return Library(**{**base, **kw})


def test_a_library_that_drives_sp_needs_a_source_for_its_factors():
    with pytest.raises(ValueError, match="neither measured nor read"):
        _library()
    with pytest.raises(ValueError, match="neither measured nor read"):
        _library(recipe=ClientKind(kind="allgather"))  # read, but no word on why it was not measured
    with pytest.raises(ValueError, match="no factor"):
        _library(drives_sp=False, recipe=ClientKind(kind="allgather"))
    assert _library(recipe=ClientKind(kind="allgather"), not_measured="why").not_measured == "why"


def _census(*libraries):
    return Census(checked="2026-12-04", deepspeed_version="0.19.8", sp=2, libraries=list(libraries), off_pypi=[])


def _kept(tmp_path, rows_by_phase):
    for phase, rows_ in rows_by_phase.items():
        rep = _report(rows_, expect="fixed" if phase == "patched" else "buggy")
        rep.deepspeed_fixed = phase == "patched"
        rep.write(tmp_path / "downstream-tf5.25" / phase / "downstream_clients.json")


def _tf525_rows(z3_patched=2.0, **kw):
    z2 = _row(stage=2, ratio=1.0, expected=1.0, **kw)
    return {
        "unpatched": [z2, _row(stage=3, ratio=1.0, expected=1.0, **kw)],
        "patched": [z2, _row(stage=3, ratio=z3_patched, expected=2.0, **kw)]
    }


def _measured_tf525(recipe=ClientKind(kind="own_share", gate="version", gate_version="0.20.2")):
    return _library(label="transformers 5.25", recipe=recipe, measured={
        "env": "downstream-tf5.25",
        "client": "transformers",
        "client_version": "5.25.0"
    })


def test_measured_factors_come_from_the_kept_reports(tmp_path):
    _kept(tmp_path, _tf525_rows())
    (row, ) = rows(_census(_measured_tf525()), tmp_path)
    assert [(s.unpatched.value, s.patched.value) for s in row.stages] == [(1.0, 1.0), (1.0, 2.0)]
    assert all(s.patched.measured for s in row.stages) and row.verdict == "must change with it"
    assert row.source == "measured: `docs/downstream-results/downstream-tf5.25/`"
    assert "| 1.000 → 1.000 | 1.000 → 2.000 |" in render(_census(_measured_tf525()), tmp_path)
    # a number changed in the run file changes the table: nothing measured is written in the census
    _kept(tmp_path, _tf525_rows(z3_patched=1.0, matches_rule=False))
    assert "| 1.000 (MISMATCH) → 1.000 (MISMATCH) |" in render(_census(_measured_tf525()), tmp_path)


def test_a_measured_library_without_its_kept_rows_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no kept report"):
        rows(_census(_measured_tf525()), tmp_path)
    _kept(tmp_path, {"unpatched": [_row(stage=2)], "patched": [_row(stage=2)]})
    with pytest.raises(ValueError, match="no measured ZeRO-2 and ZeRO-3 rows"):
        rows(_census(_measured_tf525()), tmp_path)


def test_the_recipe_read_by_hand_must_be_the_one_the_run_classified(tmp_path):
    _kept(tmp_path, _tf525_rows())
    with pytest.raises(ValueError, match="the run classified"):
        rows(_census(_measured_tf525(ClientKind(kind="allgather"))), tmp_path)


def test_the_census_file_validates_and_covers_the_libraries():
    census = Census.load(CENSUS)
    labels = [lib.label for lib in census.libraries]
    assert labels == [
        "accelerate", "transformers 5.24", "transformers 5.25", "trl", "arctic-training", "axolotl", "ms-swift",
        "xtuner", "openrlhf", "llamafactory", "verl"
    ]
    assert all(lib.evidence for lib in census.libraries)
    assert [c.ref for c in census.off_pypi] == ["hamishivi/tmax#9"]


def test_the_notice_shows_the_census_as_rendered_from_the_kept_results():
    table = render(Census.load(CENSUS), KEPT_RESULTS)
    assert block_of((PACKAGE_ROOT / "docs" / "downstream-notice.md").read_text(), BEGIN, END) == table == render()


def test_kept_census_factors_and_verdicts():
    # What the kept runs say, through the census: the verdict of each library that drives DeepSpeed's sp.
    got = {r.library.label: r.verdict for r in rows(Census.load(CENSUS), KEPT_RESULTS)}
    assert got["axolotl"] == "gains from the fix"
    assert {got[k]
            for k in ("accelerate", "transformers 5.24", "transformers 5.25", "trl", "arctic-training")
            } == {"must change with it"}
    assert {got[k] for k in ("ms-swift", "xtuner", "openrlhf", "llamafactory", "verl")} == {"untouched"}
