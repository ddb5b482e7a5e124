"""Which rank the launcher blames: the one that failed first, not the one it polled first.

CI once saw rank 1 raise and the launcher report rank 0's "Connection closed by peer": both
had exited by the time the parent polled, and it polls in rank order. These tests put real
exited processes and real status files in front of the parent's decision, in that order.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
import subprocess
import sys
from types import SimpleNamespace

import pytest

from repro.harness.exit_codes import ERROR
from repro.harness.launch import RankStatus, _Child, _report_failure, _wait


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
    RankStatus(rank, "error", ERROR, message, f"Traceback of rank {rank}\n", at=at).write(tmp_path)


def test_the_earliest_reported_error_is_the_cause_whatever_the_polling_order(tmp_path, capsys):
    children = [_exited(tmp_path, 0, ERROR), _exited(tmp_path, 1, ERROR)]
    _error(tmp_path, 0, "RuntimeError: Connection closed by peer", at=1002.0)
    _error(tmp_path, 1, "ValueError: injected failure on rank 1", at=1001.0)

    assert _report_failure(children, tmp_path) == ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: rank 1 failed: ValueError: injected failure on rank 1\n")
    assert "[rank 1] Traceback of rank 1" in err
    assert "note: rank 0 failed after rank 1: RuntimeError: Connection closed by peer" in err
    assert "[rank 0] Traceback" not in err


def test_a_rank_that_died_without_reporting_is_the_cause(tmp_path, capsys):
    children = [_exited(tmp_path, 0, ERROR), _exited(tmp_path, 1, -signal.SIGKILL)]
    _error(tmp_path, 0, "RuntimeError: Connection closed by peer", at=1000.0)

    _report_failure(children, tmp_path)
    err = capsys.readouterr().err
    assert err.startswith("error: rank 1 exited with signal SIGKILL before reporting; last lines of its log:")
    assert "[rank 1] last words of rank 1" in err
    assert "note: rank 0 failed after rank 1" in err


@pytest.mark.parametrize("other", ["ok", "running"])
def test_ranks_that_did_not_fail_are_not_blamed(tmp_path, capsys, other):
    failed = _exited(tmp_path, 1, ERROR)
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


def _a_helper_thread_holds_the_lock(release):
    release.wait(30)


def _the_rank_program_is_stuck_here(done):
    done.wait(30)


def test_the_stack_dump_has_every_thread_not_only_the_asking_one():
    import threading

    from repro.harness.launch import all_threads_stack

    release, seen = threading.Event(), {}
    helper = threading.Thread(target=_a_helper_thread_holds_the_lock, args=(release, ), daemon=True)
    helper.start()
    asker = threading.Thread(target=lambda: seen.update(stack=all_threads_stack()))
    try:
        asker.start()
        asker.join(30)  # the main thread waits in this test function meanwhile
    finally:
        release.set()
        helper.join(30)
    stack = seen["stack"]
    assert "test_the_stack_dump_has_every_thread_not_only_the_asking_one" in stack  # the main thread
    assert "_a_helper_thread_holds_the_lock" in stack  # a thread that is neither main nor asking
    assert stack.count("Thread 0x") + stack.count("Current thread 0x") >= 3


def _expiring_watchdog(monkeypatch, tmp_path, timeout: float):
    """Start the rank watchdog with os._exit caught; the main thread then waits in a known function."""
    import threading

    from repro.harness import launch

    exited, release = threading.Event(), threading.Event()
    codes = []
    monkeypatch.setattr(launch.os, "_exit", lambda code: (codes.append(code), exited.set()))
    helper = threading.Thread(target=_a_helper_thread_holds_the_lock, args=(release, ), daemon=True)
    helper.start()
    timer = launch._start_watchdog(timeout, 3, tmp_path)
    try:
        _the_rank_program_is_stuck_here(exited)
    finally:
        timer.cancel()
        release.set()
        helper.join(30)
    return codes, RankStatus.read(tmp_path, 3)


def test_the_watchdog_writes_every_threads_stack_to_the_status_file(monkeypatch, tmp_path):
    monkeypatch.delenv("REPRO_LAUNCH_DEADLINE", raising=False)
    codes, status = _expiring_watchdog(monkeypatch, tmp_path, timeout=0.2)
    assert codes == [ERROR]
    assert status is not None and status.status == "error" and status.message == "deadline of 0 s exceeded"
    # What the parent prints: the rank's program where it is stuck, and the other threads.
    assert "_the_rank_program_is_stuck_here" in status.traceback
    assert "_a_helper_thread_holds_the_lock" in status.traceback


def test_a_spawned_ranks_watchdog_fires_at_the_parents_deadline(monkeypatch, tmp_path):
    # The parent's deadline, not the rank's own start + timeout: the rank reports before the parent gives up.
    import time

    from repro.harness import launch

    monkeypatch.setenv(launch.DEADLINE_VAR, f"{time.time() + 0.3:.3f}")
    start = time.monotonic()
    codes, status = _expiring_watchdog(monkeypatch, tmp_path, timeout=3600)
    assert codes == [ERROR] and time.monotonic() - start < 20
    assert status is not None and "_the_rank_program_is_stuck_here" in status.traceback


def test_a_rank_stuck_past_the_parents_deadline_is_named_in_the_ranks_words(tmp_path, capsys):
    # A rank stuck before its watchdog started (e.g. importing under load): the parent's deadline fires first and
    # must say what the ranks' watchdog says, so a caller looking for one message sees either side's.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _wait([_Child(0, proc, tmp_path / "rank0.log")], tmp_path, 0.0, SimpleNamespace(timeout=5)) == ERROR
    finally:
        proc.kill()
        proc.wait()
    assert "error: deadline of 5 s exceeded; ranks still running: [0]" in capsys.readouterr().err


def test_kill_groups_takes_down_a_process_and_the_children_it_started(tmp_path):
    from repro.harness.launch import kill_groups

    pid_file = tmp_path / "grandchild.pid"
    code = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    kill_groups([proc], grace_s=1.0)
    assert proc.poll() == -signal.SIGTERM
    time.sleep(0.2)
    state = Path(f"/proc/{grandchild}/status")
    assert not state.exists() or "zombie" in state.read_text()
