"""Failure paths of the real launcher: exit codes, tracebacks with ranks, no survivors."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from .conftest import REPRO, ROOT, launch, popen_interruptible

pytestmark = pytest.mark.multiprocess  # starts real DeepSpeed ranks

FAULTY = ROOT / "tests" / "helpers" / "faulty_rank.py"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def _assert_no_survivors(pid_dir: Path, within: float = 0.2):
    """Every rank that wrote its pid is gone, at the latest ``within`` seconds from now."""
    pids = [int(p.read_text()) for p in pid_dir.glob("rank*.pid")]
    assert pids, "the ranks never started"
    end = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]


@pytest.fixture
def pid_dir(tmp_path):
    d = tmp_path / "pids"
    d.mkdir()
    return d


def test_a_rank_that_raises_tears_everything_down(pid_dir):
    start = time.monotonic()
    run = launch(FAULTY, "--fault", "raise", "--backend", "gloo", env={"FAULTY_PID_DIR": str(pid_dir)})
    assert run.returncode == 2
    assert "rank 1 failed: ValueError: injected failure on rank 1" in run.stderr
    assert "[rank 1] Traceback" in run.stderr
    assert time.monotonic() - start < 120  # seconds after the failure, not the 300 s deadline
    _assert_no_survivors(pid_dir)


def test_deadline(pid_dir):
    run = launch(FAULTY, "--fault", "hang", "--backend", "gloo", "--timeout", "8",
                 env={"FAULTY_PID_DIR": str(pid_dir)})
    assert run.returncode == 2
    # The ranks' watchdogs fire at the parent's deadline and report first: every thread's stack, the
    # main thread (under faulty_rank.py: asleep in its program, or on a slow machine still importing
    # torch) and the watchdog's own timer thread among them.
    assert re.search(r"error: rank \d failed: deadline of 8 s exceeded", run.stderr), run.stderr
    assert re.search(r"\[rank \d\] Thread 0x[0-9a-f]+ \(most recent call first\)", run.stderr), run.stderr
    assert re.search(r"\[rank \d\]   File \".*faulty_rank\.py\", line \d+ in ", run.stderr), run.stderr
    assert re.search(r"\[rank \d\] Current thread 0x[0-9a-f]+", run.stderr), run.stderr
    _assert_no_survivors(pid_dir)


def test_skip_has_its_own_exit_code(pid_dir):
    run = launch(FAULTY, "--fault", "skip", "--backend", "gloo", env={"FAULTY_PID_DIR": str(pid_dir)})
    assert run.returncode == 77 and "SKIP: injected skip" in run.stdout
    _assert_no_survivors(pid_dir)


def test_abort_after_reporting_does_not_turn_a_good_run_red(pid_dir):
    run = launch(FAULTY, "--fault", "abort", "--backend", "gloo", env={"FAULTY_PID_DIR": str(pid_dir)})
    assert run.returncode == 0, run.stderr
    assert "REPORT {'ok': True}" in run.stdout and "SIGABRT during teardown" in run.stderr


@pytest.mark.parametrize("argv,message", [
    (("--world-size", "3", "--sp", "2"), "world size 3 is not divisible by --sp 2"),
    (("--sp", "0"), "--sp must be >= 1"),
    (("--expect", "maybe"), "invalid choice"),
])
def test_bad_flags_exit_2_with_one_line(argv, message):
    run = launch(REPRO / "zero3_sp_grad_scale.py", "--backend", "gloo", *argv, timeout=60)
    assert run.returncode == 2 and message in run.stderr
    assert run.stdout == ""


def test_nccl_without_enough_gpus_is_skipped():
    import torch

    if torch.cuda.device_count() >= 2:  #ignore-cuda
        pytest.skip("this machine has the GPUs: nothing to skip")
    run = launch(REPRO / "zero3_sp_grad_scale.py", "--backend", "nccl", timeout=60)
    assert run.returncode == 77 and run.stdout.startswith("SKIP: nccl needs one GPU per rank")


def _start_hanging_launch(pid_dir: Path, argv: list[str]):
    import subprocess

    # TMPDIR: the launch folder a killed launcher cannot remove lands in the test's own.
    python_path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    proc = popen_interruptible(
        argv, env={
            **os.environ, "FAULTY_PID_DIR": str(pid_dir),
            "PYTHONPATH": python_path,
            "TMPDIR": str(pid_dir.parent)
        }, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while len(list(pid_dir.glob("rank*.pid"))) < 2 and time.monotonic() < end:
        time.sleep(0.1)
    return proc


# SIGTERM's twin and the two killed-parent cases in the slow tier: the fast tier's launches stay as measured.
@pytest.mark.parametrize("signame", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow_tier)])
def test_sigint_or_sigterm_stops_every_rank_and_exits_130(pid_dir, signame):
    import signal
    import sys

    proc = _start_hanging_launch(pid_dir, [sys.executable, str(FAULTY), "--fault", "hang", "--backend", "gloo"])
    proc.send_signal(getattr(signal, signame))  # the ranks run in their own sessions and never see it
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: stopped ranks [0, 1]" in err and "Traceback" not in err
    _assert_no_survivors(pid_dir)


@pytest.mark.slow_tier
def test_ranks_die_with_a_killed_launcher(pid_dir):
    import signal
    import sys

    proc = _start_hanging_launch(pid_dir, [sys.executable, str(FAULTY), "--fault", "hang", "--backend", "gloo"])
    proc.send_signal(signal.SIGKILL)  # no finally runs in the launcher
    proc.communicate(timeout=60)
    _assert_no_survivors(pid_dir, within=10)  # not the 300 s deadline


@pytest.mark.slow_tier
def test_a_job_stopped_while_a_reproducer_runs_stops_its_ranks(pid_dir, tmp_path):
    import signal
    import sys

    # The job runs the reproducer as the pipeline runs its checks: core.checks.run_logged.
    job = ("import sys; from pathlib import Path; from patch_and_test.core.checks import run_logged; "
           f"run_logged([sys.executable, {str(FAULTY)!r}, '--fault', 'hang', '--backend', 'gloo'], "
           f"Path({str(tmp_path / 'check.log')!r}), timeout=600, cwd=Path('.'))")
    proc = _start_hanging_launch(pid_dir, [sys.executable, "-c", job])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    # The launcher had its grace and stopped the ranks itself (not only the kernel, when it was killed).
    assert "interrupted: stopped ranks [0, 1]" in (tmp_path / "check.log").read_text()
    _assert_no_survivors(pid_dir, within=10)


def test_a_results_file_that_cannot_be_written_fails_before_any_rank_starts(pid_dir):
    run = launch(FAULTY, "--fault", "raise", "--backend", "gloo", "--json", "/dev/null/out/report.json",
                 env={"FAULTY_PID_DIR": str(pid_dir)}, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip() == ("error: cannot write the results file /dev/null/out/report.json: "
                                  "/dev/null is not a folder")
    assert not list(pid_dir.glob("rank*.pid"))
