"""The reproducers against the installed, unpatched DeepSpeed: the bug must show, exactly.

Needs torch and an unpatched DeepSpeed in this interpreter (the tox `tests-*` envs).
The fixed side is proven by tests/multiprocess/test_series_fixes_reproducers.py.
"""

from __future__ import annotations

import pytest

from .conftest import REPRO, launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.every_release]  # starts real DeepSpeed ranks

GRAD_SCALE = REPRO / "zero3_sp_grad_scale.py"
MIXED = REPRO / "zero3_sp_mixed_bucket.py"

# sp=2: (config, param) -> ratio on unpatched DeepSpeed (described in CONTRIBUTING.md, "The reproducers").
# config -> (small param, large param); only the large one outgrows bucket=16.
UNPATCHED_SP2_BY_CONFIG = {
    "zero1": (1.0, 1.0),
    "zero2": (1.0, 1.0),
    "zero3 rs=False cg=True bucket=500": (1.0, 1.0),
    "zero3 rs=False cg=False bucket=500": (0.5, 0.5),
    "zero3 rs=True cg=True bucket=500": (0.5, 0.5),
    "zero3 rs=False cg=True bucket=16": (1.0, 0.5),
}
UNPATCHED_SP2 = {
    (config, param): ratio
    for config, ratios in UNPATCHED_SP2_BY_CONFIG.items()
    for param, ratio in zip(("small", "large"), ratios)
}


@pytest.fixture(autouse=True)
def _needs_deepspeed(deepspeed_version):
    pass


def test_grad_scale_expect_buggy_shows_the_findings_table(tmp_path):
    run = launch(GRAD_SCALE, "--expect", "buggy", "--backend", "gloo", tmp_path=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    got = {(r["config"], r["param"]): round(r["ratio"], 6) for r in run.report["rows"]}
    assert got == UNPATCHED_SP2
    assert run.report["pattern"] == "buggy"
    assert "__avg_scatter_grads" in run.stdout and "HOLDS" in run.stdout


def test_grad_scale_expect_fixed_fails(tmp_path):
    run = launch(GRAD_SCALE, "--backend", "gloo", tmp_path=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.report["pattern"] == "buggy" and "DOES NOT HOLD" in run.stdout


def test_mixed_bucket_two_scales_in_one_model(tmp_path):
    run = launch(MIXED, "--expect", "buggy", "--backend", "gloo", tmp_path=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    by_path = {}
    for row in run.report["rows"]:
        by_path.setdefault(row["path"], set()).add(round(row["ratio"], 6))
    assert by_path == {"__avg_scatter_grads": {0.5}, "__avg_scatter_contiguous_grads": {1.0}}
    # What --expect fixed would judge on the same rows (launched for real in the slow tier, below).
    assert not all(r["fixed_ok"] for r in run.report["rows"])


@pytest.mark.slow_tier
def test_mixed_bucket_expect_fixed_fails():
    run = launch(MIXED, "--backend", "gloo")
    assert run.returncode == 1, run.stdout + run.stderr


# Two of the four 4-rank launches in the newest release's fast tier (each reproducer once, each sp once); all four
# in the slow one, and on an older release all four in its slow tier (four_ranks).
@pytest.mark.four_ranks
@pytest.mark.parametrize("script,sp", [
    (GRAD_SCALE, 2),
    (MIXED, 4),
    pytest.param(GRAD_SCALE, 4, marks=pytest.mark.slow_tier),
    pytest.param(MIXED, 2, marks=pytest.mark.slow_tier),
], ids=["2-grad_scale", "4-mixed_bucket", "4-grad_scale", "2-mixed_bucket"])
def test_four_ranks(tmp_path, script, sp):
    buggy = launch(script, "--world-size", "4", "--sp", str(sp), "--expect", "buggy", "--backend", "gloo",
                   tmp_path=tmp_path)
    assert buggy.returncode == 0, buggy.stdout + buggy.stderr
    assert (buggy.report["world_size"], buggy.report["sp"], buggy.report["dp"]) == (4, sp, 4 // sp)
    scatter = {round(r["ratio"], 6) for r in buggy.report["rows"] if r["path"] == "__avg_scatter_grads"}
    assert scatter == {1.0 / sp}
    # The same rows judged by --expect fixed: the report already says so; no second launch needed
    # for the 4-rank case (the 2-rank tests launch --expect fixed for real).
    assert buggy.report["pattern"] == "buggy" and not all(r["fixed_ok"] for r in buggy.report["rows"])


def test_twin_of_the_upstream_test_fails_exactly_as_upstream_does(tmp_path):
    """The twin must be able to fail: on unpatched DeepSpeed 3 failed, 1 passed, like upstream's (CONTRIBUTING.md,
    "Tests")."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    from .conftest import ROOT

    junit = tmp_path / "twin.xml"
    subprocess.run([
        sys.executable, "-m", "pytest", "-q", "--run-twin", "-p", "no:cacheprovider", f"--junitxml={junit}",
        "tests/multiprocess/test_zero3_sp_gradient_scale.py"
    ], cwd=ROOT, capture_output=True, text=True, timeout=900)
    outcome = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome[case.get("name")] = "failed" if case.find("failure") is not None else "passed"
    assert outcome == {
        "test[False-True-500]": "passed",
        "test[False-False-500]": "failed",
        "test[True-True-500]": "failed",
        "test[False-True-16]": "failed"
    }
