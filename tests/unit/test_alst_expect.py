"""The ALST recipe check's pure logic: the expected scales (the one rule), the fit, the verdict, the report."""

import copy
import json
import pickle

import pytest
import torch

from repro.alst.expect import fit, row_ok
from repro.alst.report import AlstReport, loss_entry, make_row, other_group_mismatch
from repro.alst.expect import RECIPES, STAGES
from repro.harness import scales

# The issue's table, written out: (recipe, stage) -> (buggy, fixed) as functions of sp.
TABLE = {
    ("allgather", 2): (lambda sp: sp, lambda sp: sp),
    ("allgather", 3): (lambda sp: 1.0, lambda sp: sp),
    ("own_share", 2): (lambda sp: 1.0, lambda sp: 1.0),
    ("own_share", 3): (lambda sp: 1.0 / sp, lambda sp: 1.0),
}

# The ALST check's own table before it took the shared rule: (recipe, stage, expect) -> the power of sp.
OLD_EXPONENT = {
    ("allgather", 2, "buggy"): 1,
    ("allgather", 2, "fixed"): 1,
    ("allgather", 3, "buggy"): 0,
    ("allgather", 3, "fixed"): 1,
    ("own_share", 2, "buggy"): 0,
    ("own_share", 2, "fixed"): 0,
    ("own_share", 3, "buggy"): -1,
    ("own_share", 3, "fixed"): 0,
}


def expected(recipe, stage, sp, expect):
    """What make_row judges against: the shared rule on the stage's default path."""
    return scales.expected_scale(scales.default_path(stage), sp, expect, recipe=recipe)


def test_the_rule_covers_every_checked_cell():
    assert {(r, s, e) for r in RECIPES for s in STAGES for e in scales.EXPECTATIONS} == set(OLD_EXPONENT)


@pytest.mark.parametrize("sp", [1, 2, 3, 4])
@pytest.mark.parametrize("cell", sorted(OLD_EXPONENT))
def test_the_rule_gives_the_old_table(cell, sp):
    recipe, stage, expect = cell
    assert expected(recipe, stage, sp, expect) == float(sp)**OLD_EXPONENT[cell]


@pytest.mark.parametrize("sp", [1, 2, 4, 8])
@pytest.mark.parametrize("recipe,stage", sorted(TABLE))
def test_expected_is_the_issue_table(recipe, stage, sp):
    buggy, fixed = TABLE[(recipe, stage)]
    assert expected(recipe, stage, sp, "buggy") == pytest.approx(buggy(sp), rel=1e-15)
    assert expected(recipe, stage, sp, "fixed") == pytest.approx(fixed(sp), rel=1e-15)


def test_zero2_does_not_change_and_zero3_moves_by_sp():
    for sp in (2, 4):
        for recipe in RECIPES:
            assert expected(recipe, 2, sp, "buggy") == expected(recipe, 2, sp, "fixed")
            assert expected(recipe, 3, sp, "fixed") == pytest.approx(sp * expected(recipe, 3, sp, "buggy"))


def test_without_sp_every_recipe_and_stage_is_one():
    assert {expected(r, s, 1, e) for r in RECIPES for s in STAGES for e in ("buggy", "fixed")} == {1.0}


@pytest.mark.parametrize("bad", [("sum", 2, 2, "fixed"), ("allgather", 2, 2, "maybe"), ("allgather", 2, 0, "fixed")])
def test_expected_rejects_unknowns(bad):
    with pytest.raises(ValueError):
        expected(*bad)


@pytest.mark.parametrize("value,label", [(1.0, "1"), (2.0, "2"), (0.5, "1/2"), (4.0, "4"), (0.25, "1/4"), (1.5, "3/2"),
                                         (2.0000001, "2"), (1.01, "other")])
def test_row_label_is_the_shared_label(value, label):
    e = _grad()
    row = make_row("allgather", 2, "w", value * e, e, 2, "fixed", "p")
    assert row.label == label == scales.label(value)


def _grad(seed=0, n=64, scale=1e-3):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def test_fit_finds_the_scale_of_a_tiny_gradient():
    e = _grad()  # O(1e-3) entries, like the tiny Llama's
    f = fit(2.0 * e, e, 2.0)
    assert f.scalar.ratio == pytest.approx(2.0) and f.scalar.residual < 1e-12 and f.elementwise_ok
    assert not fit(2.0 * e, e, 1.0).elementwise_ok  # the factor 2 is not hidden by an absolute tolerance


def test_fit_accepts_fp32_rounding_and_rejects_a_real_difference():
    e = _grad()
    noisy = (e * 0.5).float().double()  # one fp32 rounding of every entry
    assert row_ok(*_fit_args(noisy, e, 0.5), 0.5)
    tweaked = e * 0.5
    tweaked[3] *= 1.01  # one entry 1% off
    assert not row_ok(*_fit_args(tweaked, e, 0.5), 0.5)


def _fit_args(observed, expected, target):
    f = fit(observed, expected, target)
    return f.scalar.ratio, f.scalar.residual, f.elementwise_ok


def test_fit_sees_a_direction_change():
    e = _grad()
    f = fit(_grad(seed=1), e, 1.0)
    assert f.scalar.residual > 0.5 and not f.elementwise_ok


def test_fit_reuses_the_shared_scalar_fit():
    e = _grad()
    scalar = scales.fit(3.0 * e, e)
    f = fit(3.0 * e, e, 3.0, scalar)
    assert f.scalar is scalar and f.ok
    assert fit(3.0 * e, e, 3.0) == f
    # A plain frozen dataclass: copies and pickles (an attribute pass-through recursed in both).
    assert copy.copy(f) == f and pickle.loads(pickle.dumps(f)) == f


def test_fit_rejects_a_zero_baseline():
    with pytest.raises(ValueError):
        fit(torch.ones(3), torch.zeros(3), 1.0)


def pattern_of(rows):
    return AlstReport.model_construct(rows=rows, expect="fixed", losses=[]).pattern


def _rows(sp, ratios):
    """Rows whose observed gradient is ratio * baseline, judged under --expect fixed."""
    e = _grad()
    return [make_row(recipe, stage, "w", ratio * e, e, sp, "fixed", "p") for (recipe, stage), ratio in ratios.items()]


@pytest.mark.parametrize("sp", [2, 4])
def test_verdict_on_the_unpatched_pattern(sp):
    rows = _rows(sp, {k: v[0](sp) for k, v in TABLE.items()})
    assert pattern_of(rows) == "buggy"
    assert all(r.buggy_ok for r in rows)
    assert [r.ok for r in rows] == [r.stage == 2 for r in rows]  # --expect fixed: the ZeRO-3 rows fail


@pytest.mark.parametrize("sp", [2, 4])
def test_verdict_on_the_fixed_pattern(sp):
    rows = _rows(sp, {k: v[1](sp) for k, v in TABLE.items()})
    assert pattern_of(rows) == "fixed" and all(r.ok for r in rows)
    assert [r.buggy_ok for r in rows] == [r.stage == 2 for r in rows]


def test_verdict_on_something_else():
    rows = _rows(2, {("allgather", 2): 2.0, ("allgather", 3): 4.0, ("own_share", 2): 1.0, ("own_share", 3): 2.0})
    assert pattern_of(rows) == "other"
    assert pattern_of([]) == "other"


def test_loss_entry():
    assert loss_entry("allgather", 3, 10.0, 10.0)["ok"]
    assert loss_entry("allgather", 3, 10.0 * (1 + 5e-6), 10.0)["ok"]
    assert not loss_entry("allgather", 3, 10.1, 10.0)["ok"]


def _report(sp=2, expect="fixed", ratios=None, losses_ok=True):
    ratios = ratios or {k: v[1](sp) for k, v in TABLE.items()}
    rows = [
        make_row(recipe, stage, "w", ratio * _grad(), _grad(), sp, expect, "p")
        for (recipe, stage), ratio in ratios.items()
    ]
    losses = [loss_entry("allgather", 2, 10.0, 10.0 if losses_ok else 11.0)]
    return AlstReport(script="alst_recipe", deepspeed_version="0.19.8", torch_version="2.13.0",
                      transformers_version="4.57.6", backend="gloo", device="cpu", launcher="local", world_size=sp,
                      sp=sp, dp=1, expect=expect, rows=rows, losses=losses)


def test_report_holds_and_exit_code():
    assert _report().holds and _report().exit_code == 0
    buggy = {k: v[0](2) for k, v in TABLE.items()}
    assert _report(ratios=buggy).exit_code == 1
    assert _report(ratios=buggy, expect="buggy").exit_code == 0
    assert _report(losses_ok=False).exit_code == 1  # a wrong loss fails even when the gradients are right


def test_report_json_round_trip(tmp_path):
    report = _report()
    path = tmp_path / "r.json"
    report.write(path)
    data = json.loads(path.read_text())
    assert data["schema"] == AlstReport.SCHEMA and data["pattern"] == "fixed"
    assert data["holds"] and data["exit_code"] == 0
    assert set(
        data["tolerances"]) == {"ratio_rel_tol", "residual_tol", "element_rtol", "element_atol_rel", "loss_rel_tol"}
    assert [r["label"] for r in data["rows"]] == ["2", "2", "1", "1"]
    again = AlstReport.load(path)
    assert again.rows == report.rows and again.losses == report.losses


def test_report_loads_a_label_of_the_old_format():
    data = _report().to_dict()
    data["rows"][2]["label"] = "1.0"  # what scale_label wrote before scales.label
    assert AlstReport.from_dict(data).rows[2].label == "1"


def test_report_rejects_a_stored_verdict_its_rows_contradict():
    data = _report().to_dict()
    data["holds"] = False
    with pytest.raises(ValueError):
        AlstReport.from_dict(data)
    data = _report().to_dict()
    data["rows"][0]["surprise"] = 1
    with pytest.raises(ValueError):
        AlstReport.from_dict(data)


def test_report_rejects_another_schema():
    data = _report().to_dict()
    data["schema"] = "zero3-sp-gradfix/repro-report/v1"
    with pytest.raises(ValueError):
        AlstReport.from_dict(data)


def test_table_names_every_row_and_the_verdict():
    text = _report(ratios={k: v[0](2) for k, v in TABLE.items()}).table()
    assert "DOES NOT HOLD (pattern seen: buggy)" in text
    assert text.count("MISMATCH") == 2 and "allgather" in text and "own_share" in text and "1/2" in text


def test_table_shows_another_groups_loss_mismatch():
    report = _report()
    report.losses.append(other_group_mismatch())
    again = AlstReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert not again.holds and "another dp group's loss mismatched  MISMATCH" in again.table()
