"""The benchmarks' result files through their models (patch_and_test/review/benchmark_reports.py): the kept runs
load as they are, a result round-trips, a wrong field fails, and the kept summaries are what the kept launches give.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from patch_and_test.review import benchmark_reports as models, docs

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "benchmarks" / "results"
FILES = sorted(KEPT.rglob("*.json"))


def _model(path: Path):
    return docs.by_file(docs.load_models()[0], path)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(KEPT).as_posix())
def test_every_kept_result_loads_with_its_model_as_it_is(path):
    model = _model(path)
    assert model is not None and issubclass(model, models.ResultFile), path
    assert "schema" not in json.loads(path.read_text())  # kept before the key: read by file name
    model.load(path)


def test_the_kept_runs_are_every_benchmark():
    found = {_model(p) for p in FILES}
    assert found == {m for m in vars(models).values() if isinstance(m, type) and getattr(m, "SCHEMA", "")}


def test_a_result_round_trips_with_its_schema(tmp_path):
    kept = models.StressRepro.load(KEPT / "stress_repro.json")
    kept.write(tmp_path / "stress_repro.json")
    data = json.loads((tmp_path / "stress_repro.json").read_text())
    assert data["schema"] == models.StressRepro.SCHEMA and models.StressRepro.from_dict(data) == kept
    assert _model(tmp_path / "stress_repro.json") is models.StressRepro


@pytest.mark.parametrize("change, where", [
    (lambda d: d["totals"].update(hangs="none"), "totals.hangs"),
    (lambda d: d["faults"][0].update(signal=9), "faults.0.signal"),
    (lambda d: d.pop("by_kind"), "by_kind"),
    (lambda d: d.update(schema=models.LaunchCost.SCHEMA), "not a zero3-sp-gradfix/benchmark-stress-repro/v1"),
])
def test_a_wrong_field_fails(change, where):
    data = json.loads((KEPT / "stress_repro.json").read_text())
    change(data)
    with pytest.raises(ValueError, match=re.escape(where)):
        models.StressRepro.from_dict(data)


def test_a_bitwise_row_takes_only_booleans_beside_its_fields():
    row = {"world": 2, "sp": 2, "dp": 1, "dtype": "float32", "kind": "exact", "contiguous==avg_scatter[x]": True}
    assert models.BitwiseRow.model_validate(row).model_dump() == row
    with pytest.raises(ValidationError):
        models.BitwiseRow.model_validate(row | {"contiguous==avg_scatter[y]": "maybe"})


def test_a_launch_validates_before_the_driver_adds_its_fields():
    data = json.loads(next(KEPT.glob("reduce_path_launches/*/timing0.json")).read_text())
    for key in ("shm_buffers_removed", "load_average_at_start", "driver_wall_s"):
        data.pop(key)
    assert models.TimingLaunch.model_validate(data).driver_wall_s is None


def test_the_kept_summaries_are_what_the_kept_launches_give(monkeypatch):
    # reduce_path.py summarises the launches' reports (read through their model) into the rows it keeps.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("reduce_path", ROOT / "benchmarks" / "reduce_path.py")
    reduce_path = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reduce_path)
    for name in ("reduce_path.json", "reduce_path-0.14.5.json"):
        kept = models.ReducePath.load(KEPT / name)
        raw = [launch.to_dict() for launch in kept.timing_raw]
        assert reduce_path.summarize_timing(raw, kept.impls) == [row.model_dump(mode="json") for row in kept.timing]
        assert [models.LaunchInfo.model_validate(reduce_path._info(r)) for r in raw] == kept.timing_launches
    kept = models.ReducePath.load(KEPT / "reduce_path.json")
    folder = ROOT / kept.launch_reports
    raw = [models.NumericsLaunch.load(folder / f"numerics-{t}.json").to_dict() for t in ("2-2", "4-2", "4-4", "3-3")]
    assert [models.NumericsRow.model_validate(r) for r in reduce_path.numerics_rows(raw)] == kept.numerics
    assert [models.BitwiseRow.model_validate(r) for r in reduce_path.numerics_flags(raw)] == kept.numerics_bitwise


def test_bundle_verify_reads_a_kept_result_by_its_name(tmp_path):
    from patch_and_test.review.bundle import validate_reports

    data = json.loads((KEPT / "launch_cost.json").read_text())
    data["runs"]["single"][0]["wall_s"] = "fast"
    (tmp_path / "results" / "benchmarks").mkdir(parents=True)
    (tmp_path / "results" / "benchmarks" / "launch_cost.json").write_text(json.dumps(data))
    problems, _ = validate_reports(tmp_path)
    assert [p.split(": Input")[0] for p in problems] == [
        f"results/benchmarks/launch_cost.json: not a valid {models.LaunchCost.SCHEMA} report: runs.single.0.wall_s"
    ]


@pytest.mark.parametrize("fault, sig", [("sigint-parent", "SIGINT"), ("sigterm-parent", "SIGTERM")])
def test_a_signal_fault_sends_its_signal_to_the_launching_process(monkeypatch, fault, sig):
    import signal
    import subprocess
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("stress_repro", ROOT / "benchmarks" / "stress_repro.py")
    stress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stress)
    monkeypatch.setattr(stress, "_wait_until_running", lambda proc, tag: {})  # no ranks: the signal goes at once
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        next(case[3] for case in stress.FAULT_CASES if case[0] == fault)(proc, "tag")
        assert proc.wait(timeout=30) == -getattr(signal, sig)
    finally:
        proc.kill()
