import json
from pathlib import Path

import pytest

from repro.gradscale.report import Report, Row

# Reports the reproducers wrote before the report became a pydantic model (labels "1.0", not "1").
KEPT = Path(__file__).resolve().parents[2] / "docs" / "master-v4-reproducers"


def _row(path="__avg_scatter_grads", ratio=0.5, target=0.5, ok=True, buggy_target=0.5, buggy_ok=True, fixed_ok=False):
    return Row(config="zero3 rs=True cg=True bucket=500", stage=3, reduce_scatter=True, contiguous_gradients=True,
               reduce_bucket_size=500, param="large", numel=64, path=path, observed_norm=1.0, expected_norm=2.0,
               ratio=ratio, residual=0.0, label="1/2", target=target, ok=ok, buggy_target=buggy_target,
               buggy_ok=buggy_ok, fixed_ok=fixed_ok)


def _report(rows, expect="buggy"):
    return Report(script="zero3_sp_grad_scale", deepspeed_version="0.19.8", torch_version="2.13.0", backend="gloo",
                  device="cpu", launcher="local", world_size=2, sp=2, dp=1, expect=expect, rows=rows)


def test_round_trip(tmp_path):
    report = _report([_row()])
    report.wall_time_s = 1.5
    report.write(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == Report.SCHEMA and data["pattern"] == "buggy" and data["exit_code"] == 0
    assert Report.load(tmp_path / "r.json") == report


def test_patterns():
    fixed_row = _row(ratio=1.0, target=1.0, ok=True, buggy_ok=False, fixed_ok=True)
    assert _report([fixed_row], expect="fixed").pattern == "fixed"
    assert _report([_row()]).pattern == "buggy"
    # every row at 1.0 on paths the bug does not touch: that is "fixed", not "buggy"
    untouched = _row(path="stage_1_and_2", ratio=1.0, target=1.0, buggy_target=1.0, buggy_ok=True, fixed_ok=True)
    assert _report([untouched]).pattern == "fixed"
    other = _row(ratio=0.7, ok=False, buggy_ok=False, fixed_ok=False)
    assert _report([other]).pattern == "other"


def test_exit_code_follows_rows():
    assert _report([_row()]).exit_code == 0
    assert _report([_row(ok=False)]).exit_code == 1
    assert _report([]).exit_code == 1  # nothing measured holds nothing


def test_rejects_foreign_json():
    with pytest.raises(ValueError):
        Report.from_dict({"schema": "something-else", "rows": []})


def test_table_mentions_every_row_and_the_verdict():
    text = _report([_row(), _row(ok=False)]).table()
    assert text.count("zero3 rs=True") == 2 and "MISMATCH" in text and "DOES NOT HOLD" in text


def test_table_names_the_target_scale_as_a_fraction():
    text = _report([_row()]).table()
    assert "0.5000 (1/2)  1/2" in text


def test_a_stored_verdict_that_disagrees_with_the_rows_is_rejected():
    data = _report([_row(ok=False)]).to_dict()
    assert data["holds"] is False
    with pytest.raises(ValueError):
        Report.from_dict({**data, "holds": True})


@pytest.mark.parametrize("path", sorted(KEPT.glob("*.json")), ids=lambda p: p.name)
def test_kept_reports_load_and_write_back_unchanged(path):
    data = json.loads(path.read_text())
    report = Report.load(path)
    assert report.schema_name == Report.SCHEMA and report.rows
    assert report.to_dict() == data
