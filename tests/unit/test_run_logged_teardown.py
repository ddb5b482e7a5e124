"""A job killed with SIGTERM while a check runs takes the check's whole process session down with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT

# The job: runs a check (a shell that starts a long-lived grandchild and writes its pid), as the
# pipeline runs pytest; the test SIGTERMs the job, then looks for the grandchild.
JOB = """
import sys
from pathlib import Path
from patch_and_test.core.checks import run_logged
run_logged(["sh", "-c", "sleep 300 & echo $! > " + sys.argv[1] + "; wait"], Path(sys.argv[2]), timeout=120,
            cwd=Path("."))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_the_job_kills_the_checks_session(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, str(pid_file), str(tmp_path / "log")], cwd=ROOT, env={
            **os.environ, "PYTHONPATH": str(ROOT)
        })
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild), "the check's process outlived the job"
