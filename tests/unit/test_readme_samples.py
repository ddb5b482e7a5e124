"""README.md's sample output is the output of real runs kept in docs/sample-run/ (its README says which)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from patch_and_test.job.verdict import Verdict, summary_table
from repro.harness.fixed import source_has_fix
from tests.conftest import ROOT

SAMPLES = ROOT / "docs" / "sample-run"


def _blocks() -> list[list[str]]:
    """The README's plain (unlabelled) code blocks: sample output, not commands."""
    blocks, current, plain = [], None, False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            if current is None:
                current, plain = [], line == "```"
            else:
                if plain:
                    blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _block_starting(prefix: str) -> list[str]:
    found = [block for block in _blocks() if block and block[0].startswith(prefix)]
    assert len(found) == 1, f"README.md: one sample block starting {prefix!r}"
    return found[0]


def test_the_jobs_summary_is_the_kept_runs():
    shown = _block_starting("check ")
    table = summary_table(Verdict.load(SAMPLES / "verdict.json")).splitlines()
    start = table.index(shown[0])
    assert table[start:start + len(shown)] == shown


def test_the_jobs_time_is_the_kept_runs():
    seconds = f"{Verdict.load(SAMPLES / 'verdict.json').wall_time_s:.0f} s with warm"
    for doc in (ROOT / "README.md", SAMPLES / "README.md"):
        assert seconds in " ".join(doc.read_text().split()), doc


def test_the_doctors_lines_are_the_kept_runs():
    shown = _block_starting("DeepSpeed ")
    kept = (SAMPLES / "doctor.txt").read_text().splitlines()
    assert all(line in kept for line in shown), [line for line in shown if line not in kept]


def test_the_kept_doctor_run_is_what_the_doctor_says_now():
    deepspeed = pytest.importorskip("deepspeed")
    stage3 = Path(deepspeed.__file__).parent / "runtime" / "zero" / "stage3.py"
    if deepspeed.__version__.split("+")[0] != "0.19.8" or source_has_fix(stage3.read_text()):
        pytest.skip(f"the sample is DeepSpeed 0.19.8 without the fix; installed: {deepspeed.__version__}")
    done = subprocess.run([
        sys.executable, "-m", "patch_and_test", "doctor", "--ds-config", "docs/sample-run/ds_config.json", "--sp", "2"
    ], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    # an installed build says its local version where it has one (a checkout's +<hash>); the sample says 0.19.8
    now = [line.replace(deepspeed.__version__, "0.19.8") for line in done.stdout.splitlines()]
    now = [line for line in now if not line.startswith("client ")]
    kept = [line for line in (SAMPLES / "doctor.txt").read_text().splitlines() if not line.startswith("client ")]
    assert now == kept
