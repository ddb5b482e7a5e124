"""toxfile.py: tox shows a job's exit 77 as SKIP with the job's reason, and nothing else."""

from types import SimpleNamespace

import pytest

Skip = pytest.importorskip("tox.tox_env.errors").Skip
toxfile = pytest.importorskip("toxfile")

REASON = "nccl needs one GPU per rank: 2 ranks, 0 GPU(s) visible"


def outcome(code: int, err: str = "", out: str = "") -> SimpleNamespace:
    return SimpleNamespace(exit_code=code, out=out, err=err)


def test_exit_77_is_a_skip_with_the_jobs_reason():
    job = outcome(77, err=f"skipped: {REASON}\n", out="verdict: results/x/verdict.json\n")
    with pytest.raises(Skip, match="nccl needs one GPU per rank"):
        toxfile.tox_after_run_commands(None, 77, [job])


@pytest.mark.parametrize("code", [0, 1, 2, 3, 4, 5])
def test_other_exits_are_left_to_tox(code):
    # No Skip raised, and nothing returned for tox to act on: tox's own handling of the code stands.
    assert toxfile.tox_after_run_commands(None, code, [outcome(code, err="error: something\n")]) is None


def test_77_from_an_earlier_command_is_not_taken_for_the_last_ones():
    # The env's status is the first failure; only the command that exited 77 itself means "skipped".
    assert toxfile.tox_after_run_commands(None, 77, [outcome(77), outcome(0)]) is None  # no Skip raised


def test_reason_falls_back_to_the_last_line():
    assert toxfile.skip_reason(outcome(77, err="no GPU here\n")) == "no GPU here"
    assert toxfile.skip_reason(outcome(77)) == "exit 77"

