"""The downstream job's record (results/downstream/<env>/run.json): checks typed, paths relative to it."""

from __future__ import annotations

from patch_and_test.core.checks import ReproCheck
from patch_and_test.downstream.run import DownstreamRun, relative_check
from tests.conftest import ROOT


def _check(results, phase: str) -> ReproCheck:
    return ReproCheck(name=f"{phase}/downstream_clients", script="downstream_clients", expect="fixed", exit_code=0,
                      pattern="fixed", report=str(results / phase / "downstream_clients.json"),
                      log=str(results / phase / "downstream_clients.log"), duration_s=1.5)


def test_a_check_is_recorded_relative_to_the_results_and_round_trips(tmp_path):
    check = relative_check(_check(tmp_path, "patched"), tmp_path)
    assert (check.report, check.log) == ("patched/downstream_clients.json", "patched/downstream_clients.log")
    run = DownstreamRun(env="downstream-trl", deepspeed_version="0.19.8", series="v0.19.8", applied=[],
                        marker_source="series 0004", clients={}, transformers_patches=[], steps=[], checks=[check])
    run.write(tmp_path / "run.json")
    assert DownstreamRun.load(tmp_path / "run.json").checks == [check]


def test_the_kept_runs_load():
    kept = sorted((ROOT / "docs" / "downstream-results").glob("*/run.json"))
    assert kept and all(DownstreamRun.load(path).checks for path in kept)
