"""The affected-tests job's verdict (affected.json) as a pydantic model: old files load, edits are rejected."""

from __future__ import annotations

import json

import pytest

from patch_and_test.core.errors import Exit
from patch_and_test.upstream.job import SCHEMA, AffectedVerdict
from tests.conftest import ROOT

KEPT = sorted((ROOT / "docs" / "affected-results").glob("*/affected.json"))


@pytest.mark.parametrize("path", KEPT, ids=lambda p: p.parent.name)
def test_every_kept_run_loads_with_its_own_outcome(path):
    data = json.loads(path.read_text())
    v = AffectedVerdict.load(path)
    assert (v.outcome, v.exit_code) == (data["outcome"], data["exit_code"])
    written = v.to_dict()
    assert written["schema"] == SCHEMA and {k: written[k] for k in data} == data


def test_written_and_read_back_equal(tmp_path):
    v = AffectedVerdict.load(KEPT[0])
    v.write(tmp_path / "affected.json")
    assert AffectedVerdict.load(tmp_path / "affected.json") == v


def test_a_stored_outcome_its_suite_contradicts_is_rejected():
    data = json.loads(KEPT[0].read_text())
    with pytest.raises(ValueError, match="stored outcome='regression'"):
        AffectedVerdict.from_dict({**data, "outcome": "regression"})
    data["suite"]["status"] = "regression"
    with pytest.raises(ValueError, match="stored outcome='no-regression'"):
        AffectedVerdict.from_dict(data)


def test_an_error_maps_as_the_pipeline_maps_it():
    v = AffectedVerdict(source="s", series="s", error="git am failed", error_exit=Exit.SERIES_DOES_NOT_APPLY)
    assert (v.outcome, v.exit_code) == ("series-does-not-apply", 4)
    assert AffectedVerdict(source="s", series="s").outcome == "error"  # no suite ran
