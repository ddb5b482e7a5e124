"""The parity audit's quick mode for real, against the installed (unpatched) DeepSpeed.

--expect buggy must hold (exit 0): every gradient reduced by ZeRO-3's __avg_scatter_grads with
sp > 1 at 1/sp, everything else at the oracle or where a documented known discrepancy puts it.
--expect fixed must not (exit 1), and only because of the sp bug's points: judged again from the
same run's JSON (--from-json), so the five launches (one per topology) happen once.
"""

from __future__ import annotations

import json

import pytest

from .conftest import REPRO, launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow_tier]  # five launches, about two minutes: the slow tier

AUDIT = REPRO / "parity_audit.py"
AVG_SCATTER = "__avg_scatter_grads"


@pytest.fixture(autouse=True)
def _needs_deepspeed(deepspeed_version):
    pass


def _sp_bug_rows(report):
    return [(p, r) for p in report["points"] for r in p["rows"] if r["path"] == AVG_SCATTER and p["point"]["sp"] > 1]


@pytest.fixture(scope="module")
def buggy_run(tmp_path_factory):
    return launch(AUDIT, "--expect", "buggy", "--backend", "gloo", "--table", "failing", "--timeout", "2400",
                  timeout=2700, tmp_path=tmp_path_factory.mktemp("audit"))


def test_quick_expect_buggy_holds(buggy_run):
    run = buggy_run
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = run.report
    counts = report["summary"]["counts"]
    assert counts["unexplained"] == 0 and counts["error"] == 0 and counts["sp_bug"] > 0
    assert {(t["world_size"], t["sp"]) for t in report["topologies"]} == {(1, 1), (2, 1), (2, 2), (4, 2), (4, 4)}
    rows = _sp_bug_rows(report)
    assert rows and all(r["ok"]["buggy"] for _, r in rows)
    # without a known discrepancy on the row, the sp bug is exactly 1/sp
    assert all(r["label"] == f"1/{p['point']['sp']}" for p, r in rows if not r["known"])
    assert "--expect buggy: HOLDS" in run.stdout


def test_quick_expect_fixed_fails_on_the_sp_bug_only(buggy_run, tmp_path):
    assert buggy_run.report is not None, buggy_run.stderr[-4000:]
    saved = tmp_path / "buggy.json"
    saved.write_text(json.dumps(buggy_run.report))
    run = launch(AUDIT, "--from-json", str(saved), "--expect", "fixed", "--table", "none", timeout=120,
                 tmp_path=tmp_path)
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]
    report = run.report
    failing = [p for p in report["points"] if not p["holds"]]
    assert failing
    for p in failing:
        assert p["status"] == "ran" and p["point"]["sp"] > 1
        assert {r["path"] for r in p["rows"] if not r["ok"]["fixed"]} == {AVG_SCATTER}
    assert report["summary"]["counts"]["unexplained"] == 0
    assert "--expect fixed: DOES NOT HOLD" in run.stdout


# 0 s: the signal lands as the first launch starts; 3 s: while its rank runs.
@pytest.mark.parametrize("delay_s", [0, 3])
def test_ctrl_c_stops_the_audit_not_only_its_current_launch(delay_s):
    import signal
    import subprocess
    import sys
    import time

    from .conftest import popen_interruptible

    proc = popen_interruptible([sys.executable, str(AUDIT), "--expect", "buggy", "--backend", "gloo"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stderr.readline()]
        while "[parity-audit] launch" not in lines[-1] and lines[-1]:
            lines.append(proc.stderr.readline())
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        lines += proc.communicate(timeout=60)[1].splitlines()  # times out if the next topology starts
        assert proc.returncode == 130, lines
    finally:
        proc.kill()
    assert sum("[parity-audit] launch" in line for line in lines) == 1, lines
