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
    # Even with a "skipped: " line in its output, only exit 77 makes a skip: tox's own handling of the code stands.
    job = outcome(code, err=f"skipped: {REASON}\nerror: something\n")
    assert toxfile.skip_for(code, [job]) is None
    assert toxfile.skip_for(77, [outcome(77, err=job.err)]) == REASON  # the same output under 77: a skip
    toxfile.tox_after_run_commands(None, code, [job])  # raises nothing


def test_77_from_an_earlier_command_is_not_taken_for_the_last_ones():
    # The env's status is the first failure; only the command that exited 77 itself means "skipped".
    earlier = outcome(77, err=f"skipped: {REASON}\n")
    assert toxfile.skip_for(77, [earlier, outcome(0)]) is None
    assert toxfile.skip_for(77, [outcome(0), earlier]) == REASON
    toxfile.tox_after_run_commands(None, 77, [earlier, outcome(0)])  # raises nothing


def test_the_torch_requirement_is_the_pin_unless_torch_spec_says_otherwise(monkeypatch):
    from patch_and_test.core import pins

    assert toxfile._PINS.torch_requirement({}) == pins.torch_requirement({}) == f"torch=={pins.version('torch')}"
    assert toxfile._PINS.torch_requirement({"TORCH_SPEC": ">=2.9,<2.10"}) == "torch>=2.9,<2.10"


def test_reason_falls_back_to_the_last_line():
    assert toxfile.skip_reason(outcome(77, err="no GPU here\n")) == "no GPU here"
    assert toxfile.skip_reason(outcome(77)) == "exit 77"
