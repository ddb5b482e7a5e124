"""The records each producer returns for the verdict: made where the fact is made, typed, and written as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from patch_and_test.core.checks import ended_early, outcome_counts
from patch_and_test.core.errors import Exit
from patch_and_test.core.series import SkippedPatch, load_manifest
from patch_and_test.core.source import Graft, SourceTree
from repro.harness.env import HostEnvironment, host_environment

GRAFT = Graft(commit="c" * 40, release="0.19.8", sdist_sha256="s" * 64, history="h" * 40, history_date="2026-08-22")


def test_a_source_tree_records_everything_but_its_lock():
    tree = SourceTree(path=Path("/tmp/t"), version="0.19.8", origin="newest-upstream", upstream_commit="c" * 40,
                      base="b", branch="main", has_tests=True, dropped_paths=("docs/x.png", ), graft=GRAFT,
                      claim=open(__file__))
    tree.release()
    data = tree.record().model_dump(mode="json")
    assert data["path"] == "/tmp/t" and data["dropped_paths"] == ["docs/x.png"
                                                                  ] and data["graft"]["release"] == "0.19.8"
    assert "claim" not in data and "series_name" not in data


def test_a_series_records_what_applied_once_it_did():
    series = load_manifest().by_name("master")
    chosen = series.record()
    assert chosen.range == series.range_text and chosen.applied is None and chosen.head is None
    applied = series.record(applied=("0001-a.patch", ), skipped=(SkippedPatch(file="0002-b.patch",
                                                                              reason="needs tests/"), ), base="b" * 40,
                            head="h" * 40)
    done = applied.model_dump(mode="json")
    assert done["applied"] == ["0001-a.patch"] and done["skipped"] == [{
        "file": "0002-b.patch",
        "reason": "needs tests/"
    }]
    assert (done["base"], done["head"]) == ("b" * 40, "h" * 40)
    assert applied.summary() == (f"applied series master v{series.version}: 1 patch(es) -> {'h' * 12}\n"
                                 "skipped 0002-b.patch: needs tests/")


def test_the_host_environment_is_typed():
    env = host_environment("gloo")
    assert isinstance(env, HostEnvironment) and env.device == "cpu" and env.python
    with pytest.raises(ValueError):
        HostEnvironment.model_validate({**env.model_dump(), "gpus": "many"})


def test_one_outcome_counter_names_every_outcome():
    assert outcome_counts({
        "a": "passed",
        "b": "error",
        "c": "passed"
    }) == {
        "passed": 2,
        "failed": 0,
        "error": 1,
        "skipped": 0
    }


@pytest.mark.parametrize("code,outcome", [(Exit.SKIPPED, "skipped"),
                                          (Exit.SERIES_DOES_NOT_APPLY, "series-does-not-apply"),
                                          (Exit.ALREADY_FIXED, "already-fixed"), (Exit.ERROR, "error"),
                                          (None, "error")])
def test_a_job_an_error_ended(code, outcome):
    assert ended_early(code) == (outcome, Exit(code if code is not None else Exit.ERROR))
