"""A deliberately regressing series on a real DeepSpeed master: the affected-tests job must say so.

The fixture ``fixtures/regressing-series`` is the fix alone, as patch 0001 of the master series was
before the autoep unit test learnt about ``sequence_parallel_size``: on master it makes
``TestAutoEPConfig::test_zero3_autoep_reduce_scatter_grads_average_by_global_dp`` fail (the test
builds the optimizer with ``object.__new__``). The job runs DeepSpeed's own pytest on a real
checkout before and after ``git am`` (narrowed to that test file, to stay cheap: no ranks) and
must end with the regression outcome, exit 6, naming that test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from patch_and_test.upstream import affected
from patch_and_test.core import source
from patch_and_test.core.errors import Exit

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "regressing-series"
AUTOEP = "tests/unit/v1/moe/test_autoep_unit.py"
REGRESSED = "test_zero3_autoep_reduce_scatter_grads_average_by_global_dp"

pytestmark = [pytest.mark.mirror, pytest.mark.git_tools, pytest.mark.slow_tier]


@pytest.fixture(scope="module")
def master_checkout(mirror, tmp_path_factory):
    """A clean checkout of the mirror's master (blob-less paths dropped in one local commit)."""
    tree = source.from_mirror("master", mirror, cache=tmp_path_factory.mktemp("cache"))
    tree.release()
    if not (tree.path / AUTOEP).is_file():
        pytest.skip(f"the mirror's master has no {AUTOEP}")
    return tree.path


def test_the_selection_reaches_the_autoep_test(master_checkout):
    selection = affected.select_for_series(FIXTURE, master_checkout)
    reasons = {f.path: f.reasons for f in selection.files}
    assert AUTOEP in reasons
    assert any("__avg_scatter_grads" in r for r in reasons[AUTOEP])


def test_the_job_ends_with_the_regression_naming_the_autoep_test(master_checkout, tmp_path):
    pytest.importorskip("deepspeed")  # DeepSpeed's tests need its dependencies (torch, ...) in this python
    results = tmp_path / "results"
    proc = subprocess.run([
        sys.executable, "-m", "patch_and_test", "affected", "run", "--src",
        str(master_checkout), "--series",
        str(FIXTURE), "--results",
        str(results), "--only", AUTOEP
    ], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == Exit.REGRESSION, out[-4000:]
    assert "outcome: regression (exit 6)" in out
    verdict = json.loads((results / "affected.json").read_text())
    assert verdict["outcome"] == "regression" and verdict["exit_code"] == 6
    suite = verdict["suite"]
    regressed = [t for t in suite["regressions"] if REGRESSED in t]
    assert regressed, suite["regressions"]
    result = next(r for r in suite["results"] if r["test"] == regressed[0])
    assert (result["before"], result["after"]) == ("passed", "failed")
    assert "sequence_parallel_size" in result["reason"]  # AttributeError: ... no attribute 'sequence_parallel_size'
    assert len(result["reruns"]) == 2 and "passed" not in result["reruns"]
    assert f"regression: {regressed[0]}" in out
    # Everything else either passed both times or is reported with its reason, never dropped.
    assert suite["collected_after"] >= suite["collected_before"] > 1
    assert suite["status"] == "regression" and not suite["errors"]
