import json

import pytest

from repro.audit.expect import KnownDiscrepancy
from repro.audit.report import AuditReport, MeasuredPoint, MeasuredRow, Point, Row, raw_point, render_summary
from repro.audit.space import AuditPoint
from tests.conftest import FIXTURES

KNOWN = [
    KnownDiscrepancy(id="zero12-predivide", title="t", when={
        "stage": (1, ),
        "predivide": ("world", )
    }, factor="1/sp", writeup="docs/x.md", code=("stage_1_and_2.py: the line", ), upstream="#1",
                     measured_on=("0.19.8", ))
]


def _row(param, path, ratio):
    return MeasuredRow(param=param, numel=4, path=path, grad_dtype="float32", ratio=ratio, residual=0.0,
                       max_rel_dev=0.0)


def _point(point: AuditPoint, ratios, path, status="ran", message=""):
    rows = [_row(name, path, r) for name, r in zip(("small", "large"), ratios)]
    return raw_point(point.model_dump(), status, message, "Opt", 0.1, rows if status == "ran" else [])


P_SP = AuditPoint(3, True, True, "fits", 2, 1)
P_OK = AuditPoint(0, None, None, None, 2, 1)
P_KNOWN = AuditPoint(1, False, True, "fits", 2, 1, predivide="world")
P_REJ = AuditPoint(2, True, True, "fits", 2, 1, predivide="world")
P_MIXED = AuditPoint(3, False, True, "overflow", 2, 1)


def _points(sp_ratio=0.5):
    return [
        _point(P_SP, (sp_ratio, sp_ratio), "__avg_scatter_grads"),
        _point(P_OK, (1.0, 1.0), "engine.allreduce_bucket"),
        _point(P_KNOWN, (0.5, 0.5), "stage_1_and_2.gradient_reduction_w_predivide"),
        _point(P_REJ, (), "", status="rejected", message="AssertionError: not supported"),
    ]


def _report(points, expect="buggy", topo_code=0):
    return AuditReport.build(
        known=KNOWN, known_file="k.toml", expect=expect, points=points, script="parity_audit",
        deepspeed_version="0.19.8", torch_version="2.13.0", backend="gloo", device="cpu", launcher="local",
        mode="quick", topologies=[
            dict(world_size=2, sp=2, dp=1, points=len(points), exit_code=topo_code, wall_time_s=1.0, message="")
        ])


def test_buggy_holds_fixed_does_not():
    buggy, fixed = _report(_points(), "buggy"), _report(_points(), "fixed")
    assert buggy.holds and buggy.exit_code == 0
    assert not fixed.holds and fixed.exit_code == 1
    assert fixed.summary.failing_points == (P_SP.id, )
    c = buggy.summary.counts
    assert (c.points, c.ran, c.rejected, c.match, c.sp_bug, c.known, c.unexplained) == (4, 3, 1, 1, 1, 1, 0)


def test_with_the_fix_fixed_holds():
    assert _report(_points(sp_ratio=1.0), "fixed").exit_code == 0
    assert _report(_points(sp_ratio=1.0), "buggy").exit_code == 1


def test_summary_groups_disagreements_by_code_path_and_cause():
    pts = _points() + [
        _point(P_MIXED, (1.0, 0.5), "__avg_scatter_grads"),
        _point(AuditPoint(2, False, False, "fits", 2, 1), (0.9, 0.9), "stage_1_and_2.buffered_reduce_fallback")
    ]
    s = _report(pts).to_dict()["summary"]
    groups = {(g["path"], g["cause"]): g for g in s["disagreements"]}
    assert set(groups) == {("__avg_scatter_grads", "sp-bug"),
                           ("stage_1_and_2.gradient_reduction_w_predivide", "zero12-predivide"),
                           ("stage_1_and_2.buffered_reduce_fallback", "unexplained")}
    sp = groups[("__avg_scatter_grads", "sp-bug")]
    assert sp["points"] == 2 and sp["rows"] == 3 and sp["ratios"] == {"1/2": 3} and "stage3.py" in sp["code"][0]
    assert groups[("stage_1_and_2.gradient_reduction_w_predivide",
                   "zero12-predivide")]["code"] == ["stage_1_and_2.py: the line"]
    assert s["disagreements"][-1]["cause"] == "unexplained"  # surprises listed last
    assert s["rejected"] == [{"message": "AssertionError: not supported", "points": 1, "examples": [P_REJ.id]}]
    assert s["known_points"] == {"zero12-predivide": 1}


def test_error_points_fail_and_failed_launches_exit_2():
    err = _points() + [_point(P_MIXED, (), "", status="error", message="RuntimeError: boom")]
    assert _report(err).exit_code == 1
    assert _report(_points(), topo_code=2).exit_code == 2


def test_json_round_trip_and_rejudge(tmp_path):
    report = _report(_points())
    report.write(tmp_path / "a.json")
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["schema"] == AuditReport.SCHEMA and data["exit_code"] == 0 and data["holds"] is True
    back = AuditReport.load(tmp_path / "a.json")
    assert back.to_dict() == report.to_dict()
    assert back.rejudge(KNOWN, "k.toml", "fixed").exit_code == 1
    # without the known list the predivide point is unexplained: buggy no longer holds
    assert back.rejudge([], "none", "buggy").summary.counts.unexplained == 1
    with pytest.raises(ValueError):
        AuditReport.from_dict({"schema": "x"})


def test_table_and_summary_text():
    report = _report(_points(), "fixed")
    table = report.table()
    assert all(p.id in table for p in report.points) and "MISMATCH" in table and "rejected" in table
    assert P_SP.id in report.table(only_failing=True) and P_OK.id not in report.table(only_failing=True)
    text = render_summary(report)
    assert "DOES NOT HOLD" in text and "sp-bug" in text and "zero12-predivide" in text and "not supported" in text


def test_points_and_rows_are_typed_records():
    report = _report(_points())
    assert all(isinstance(p, Point) for p in report.points)
    sp = next(p for p in report.points if p.id == P_SP.id)
    row = sp.rows[0]
    assert isinstance(row, Row) and row.path == "__avg_scatter_grads" and row.label == "1/2"
    assert row.target["buggy"] == row.target.buggy == 0.5 and row.ok["buggy"] and not row.ok.fixed
    with pytest.raises(KeyError):  # keyed by expectation only, not by any attribute
        row.target["model_dump"]
    assert sp.point.sp == 2 and sp.point.dtype == "fp32" and sp.category == "sp_bug"
    raw = raw_point(P_SP.model_dump(), "ran", "", "Opt", 0.1, [_row("small", "x", 1)])
    assert isinstance(raw, MeasuredPoint)
    with pytest.raises(ValueError):  # frozen, no unknown fields
        raw_point({**P_SP.model_dump(), "colour": "red"}, "ran", "", "Opt", 0.1, [])
    with pytest.raises(ValueError):
        raw_point(P_SP.model_dump(), "finished", "", "Opt", 0.1, [])


def test_judging_again_ignores_the_old_judgement():
    report = _report(_points())
    again = AuditReport.build(
        known=KNOWN, known_file="k.toml", expect="fixed", points=report.to_dict()["points"], **{
            k: v
            for k, v in report.to_dict().items() if k in ("script", "deepspeed_version", "torch_version", "backend",
                                                          "device", "launcher", "mode", "topologies")
        })
    assert again.to_dict()["points"] == report.rejudge(KNOWN, "k.toml", "fixed").to_dict()["points"]


def test_a_file_whose_verdict_disagrees_with_its_rows_is_rejected(tmp_path):
    data = _report(_points()).to_dict()
    assert AuditReport.from_dict(data).exit_code == 0
    with pytest.raises(ValueError, match="exit_code"):
        AuditReport.from_dict({**data, "exit_code": 1})
    with pytest.raises(ValueError):
        AuditReport.from_dict({**data, "points": [{**data["points"][0], "status": "done"}]})


def test_a_report_the_pre_package_audit_wrote_still_loads():
    """tests/fixtures/parity-audit/old-code-sp2dp1-buggy.json: written by repro/parity_audit.py before
    the audit became repro/audit/ (DeepSpeed 0.19.8, gloo, world 2 sp 2, 13 points, --expect buggy)."""

    from repro.audit.expect import DEFAULT_KNOWN_FILE, load_known

    path = FIXTURES / "parity-audit" / "old-code-sp2dp1-buggy.json"
    data = json.loads(path.read_text())
    report = AuditReport.load(path)
    assert report.to_dict() == data  # every key and value, derived ones included
    assert report.exit_code == 0 and report.summary.counts.sp_bug == 8 and report.summary.counts.rejected == 2
    known = load_known(DEFAULT_KNOWN_FILE)
    assert report.rejudge(known, "k.toml", "buggy").to_dict()["points"] == data["points"]
    assert report.rejudge(known, "k.toml", "fixed").exit_code == 1
