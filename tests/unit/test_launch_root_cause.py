"""Which rank the launcher blames: the one that failed first, not the one it polled first.

CI once saw rank 1 raise and the launcher report rank 0's "Connection closed by peer": both
had exited by the time the parent polled, and it polls in rank order. These tests put real
exited processes and real status files in front of the parent's decision, in that order.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from repro.harness.cli import EXIT_ERROR
from repro.harness.launch import RankStatus, _Child, _report_failure


def _exited(tmp_path, rank: int, code: int) -> _Child:
    log = tmp_path / f"rank{rank}.log"
    log.write_text(f"last words of rank {rank}\n")
    if code < 0:
        proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    else:
        proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait(timeout=30)
    return _Child(rank, proc, log)


def _error(tmp_path, rank: int, message: str, at: float) -> None:
    RankStatus(rank, "error", EXIT_ERROR, message, f"Traceback of rank {rank}\n", at=at).write(tmp_path)


def test_the_earliest_reported_error_is_the_cause_whatever_the_polling_order(tmp_path, capsys):
    children = [_exited(tmp_path, 0, EXIT_ERROR), _exited(tmp_path, 1, EXIT_ERROR)]
    _error(tmp_path, 0, "RuntimeError: Connection closed by peer", at=1002.0)
    _error(tmp_path, 1, "ValueError: injected failure on rank 1", at=1001.0)

    assert _report_failure(children, tmp_path) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: rank 1 failed: ValueError: injected failure on rank 1\n")
    assert "[rank 1] Traceback of rank 1" in err
    assert "note: rank 0 failed after rank 1: RuntimeError: Connection closed by peer" in err
    assert "[rank 0] Traceback" not in err


def test_a_rank_that_died_without_reporting_is_the_cause(tmp_path, capsys):
    children = [_exited(tmp_path, 0, EXIT_ERROR), _exited(tmp_path, 1, -signal.SIGKILL)]
    _error(tmp_path, 0, "RuntimeError: Connection closed by peer", at=1000.0)

    _report_failure(children, tmp_path)
    err = capsys.readouterr().err
    assert err.startswith("error: rank 1 exited with signal SIGKILL before reporting; last lines of its log:")
    assert "[rank 1] last words of rank 1" in err
    assert "note: rank 0 failed after rank 1" in err


@pytest.mark.parametrize("other", ["ok", "running"])
def test_ranks_that_did_not_fail_are_not_blamed(tmp_path, capsys, other):
    failed = _exited(tmp_path, 1, EXIT_ERROR)
    _error(tmp_path, 1, "ValueError: injected failure on rank 1", at=1000.0)
    if other == "ok":
        ok = _exited(tmp_path, 0, 0)
        RankStatus(0, "ok", 0, at=999.0).write(tmp_path)
        children = [ok, failed]
    else:
        running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        children = [_Child(0, running, tmp_path / "rank0.log"), failed]
    try:
        _report_failure(children, tmp_path)
    finally:
        if other == "running":
            running.kill()
            running.wait()
    err = capsys.readouterr().err
    assert err.startswith("error: rank 1 failed: ValueError") and "rank 0" not in err


def test_the_watchdog_reports_the_main_threads_stack_not_its_own():
    import threading

    from repro.harness.launch import main_thread_stack

    seen = {}
    worker = threading.Thread(target=lambda: seen.update(stack=main_thread_stack()))

    def stuck_in_the_program():
        worker.start()
        worker.join()

    stuck_in_the_program()
    assert "stuck_in_the_program" in seen["stack"] and "main_thread_stack" not in seen["stack"]
