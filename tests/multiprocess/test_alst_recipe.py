"""repro/alst_recipe.py for real: ranks of the installed DeepSpeed, a tiny Llama, the ALST recipe.

Skips without transformers (the 'alst' extra). Works on an unpatched DeepSpeed (0.17.2 ..
0.19.8) and on one with the ZeRO-3 fix: whichever it is, exactly one of --expect buggy /
--expect fixed must hold, and the ratios must be the ones in the issue's table.
"""

from __future__ import annotations

import pytest

from .conftest import REPRO, launch

pytestmark = pytest.mark.multiprocess  # starts real DeepSpeed ranks

ALST = REPRO / "alst_recipe.py"
TIMEOUT = "1500"  # two cores shared with other jobs; a first run also JIT-builds DeepSpeed's CPU comm op

BUGGY = {("allgather", 2): "sp", ("allgather", 3): "1", ("own_share", 2): "1", ("own_share", 3): "1/sp"}
FIXED = {("allgather", 2): "sp", ("allgather", 3): "sp", ("own_share", 2): "1", ("own_share", 3): "1"}


@pytest.fixture(autouse=True)
def _needs_alst(deepspeed_version):
    pytest.importorskip("transformers")
    from repro.alst.measure import skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def _value(word: str, sp: int) -> float:
    return {"sp": float(sp), "1": 1.0, "1/sp": 1.0 / sp}[word]


def _ratios(report) -> dict:
    got = {}
    for row in report["rows"]:
        got.setdefault((row["recipe"], row["stage"]), set()).add(round(row["ratio"], 4))
    return got


def _check(report, sp: int) -> str:
    """The pattern the report shows, after checking every row against it."""
    pattern = report["pattern"]
    assert pattern in ("buggy", "fixed"), report["rows"]
    table = BUGGY if pattern == "buggy" else FIXED
    assert _ratios(report) == {k: {round(_value(v, sp), 4)} for k, v in table.items()}
    assert all(x["ok"] for x in report["losses"])
    assert {r["path"] for r in report["rows"] if r["stage"] == 3} == {"__avg_scatter_grads"}
    return pattern


# The slow tier: two launches of about 30 s each (the fast tier, the README's test command, has the ALST unit
# tests and the skip below; the whole job runs the recipe again).
@pytest.mark.slow_tier
def test_two_ranks_exactly_one_expectation_holds(tmp_path):
    first = launch(ALST, "--expect", "buggy", "--backend", "gloo", "--timeout", TIMEOUT, tmp_path=tmp_path)
    assert first.returncode in (0, 1), first.stdout + first.stderr
    pattern = _check(first.report, sp=2)
    assert first.returncode == (0 if pattern == "buggy" else 1)
    assert (first.report["world_size"], first.report["sp"], first.report["dp"]) == (2, 2, 1)
    assert "HOLDS" in first.stdout and "allgather" in first.stdout
    # The other expectation, launched for real, must not hold.
    other = "fixed" if pattern == "buggy" else "buggy"
    second = launch(ALST, "--expect", other, "--backend", "gloo", "--timeout", TIMEOUT, tmp_path=tmp_path)
    assert second.returncode == 1, second.stdout + second.stderr
    assert second.report["pattern"] == pattern and "DOES NOT HOLD" in second.stdout


@pytest.mark.slow_tier
def test_four_ranks_sp2_dp2(tmp_path):
    run = launch(ALST, "--world-size", "4", "--sp", "2", "--expect", "buggy", "--backend", "gloo", "--timeout",
                 TIMEOUT, tmp_path=tmp_path)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    assert (run.report["world_size"], run.report["sp"], run.report["dp"]) == (4, 2, 2)
    pattern = _check(run.report, sp=2)
    assert run.returncode == (0 if pattern == "buggy" else 1)


def test_transformers_that_cannot_import_is_a_skip(tmp_path):
    # find_spec sees a transformers package, importing it fails: the ranks report a skip (77) with the reason.
    stub = tmp_path / "stub" / "transformers"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no transformers here')\n")
    import os

    run = launch(ALST, "--backend", "gloo", "--timeout", TIMEOUT,
                 env={"PYTHONPATH": f"{stub.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert run.returncode == 77, run.stdout + run.stderr
    assert "SKIP:" in run.stdout and "transformers" in run.stdout
