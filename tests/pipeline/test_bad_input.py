"""The pipeline's CLI on bad input: one line on stderr, the documented exit code, nothing changed.

Real git throughout; the "does not apply" and "dirty" cases use a real DeepSpeed checkout made from
the mirror (skipped without one). Every case ends before anything is built or installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patch_and_test.core import source
from patch_and_test.core.errors import Exit
from patch_and_test.core.series import STAGE3

from tests.conftest import repo_state

ROOT = Path(__file__).resolve().parents[2]
FIXED_LINE = "averaging_world_size = self._gradient_averaging_world_size(params_to_reduce, partition_world_size)"


def pipeline(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    results = tmp_path / "results"
    clean = {
        k: v
        for k, v in os.environ.items() if k not in ("DEEPSPEED_SRC", "DEEPSPEED_VERSION", "ZERO3_SP_BACKEND")
    }
    cmd = [sys.executable, "-m", "patch_and_test", "run", "--results", str(results), "--no-audit", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=clean | (env or {}), timeout=300)
    verdict = json.loads((results / "verdict.json").read_text()) if (results / "verdict.json").exists() else {}
    return proc, verdict


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stdout + proc.stderr
    prefix = "skipped: " if code == Exit.SKIPPED else "error: "
    assert len(lines) == 1 and lines[0].startswith(prefix), proc.stderr
    for word in words:
        assert word in lines[0]


@pytest.fixture
def checkout(tmp_path, mirror) -> Path:
    """A user's real DeepSpeed checkout of the mirror's master (blobs the snapshot lacks dropped)."""
    repo = tmp_path / "DeepSpeed"
    source.clone_shared(mirror, repo)
    source.prepare_working_copy(repo, "master", "master")
    return repo


def test_src_not_a_git_checkout(tmp_path):
    plain = tmp_path / "not-a-repo"
    plain.mkdir()
    proc, verdict = pipeline(tmp_path, "--src", str(plain))
    assert_one_line_error(proc, Exit.ERROR, str(plain))
    assert verdict["outcome"] == "error" and verdict["exit_code"] == Exit.ERROR
    assert list(plain.iterdir()) == []


def test_src_a_git_repo_but_not_deepspeed(tmp_path):
    repo = tmp_path / "other"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README").write_text("not DeepSpeed\n")
    subprocess.run(["git", "-C", str(repo), "add", "README"], check=True)
    subprocess.run([
        "git", "-C",
        str(repo), "-c", "user.name=A User", "-c", "user.email=user@example.com", "commit", "-q", "-m", "init"
    ], check=True)
    proc, _ = pipeline(tmp_path, "--src", str(repo))
    assert_one_line_error(proc, Exit.ERROR, "not a DeepSpeed checkout")


def test_unknown_version(tmp_path):
    proc, verdict = pipeline(tmp_path, "--version", "0.9.9")
    assert_one_line_error(proc, Exit.ERROR, "0.9.9")
    assert verdict["outcome"] == "error"


def test_version_and_src_together(tmp_path):
    proc, _ = pipeline(tmp_path, "--version", "0.19.8", "--src", str(tmp_path))
    assert_one_line_error(proc, Exit.ERROR, "one of")


def test_nccl_without_gpus_is_skipped_with_the_reason(tmp_path):
    proc, verdict = pipeline(tmp_path, "--backend", "nccl", env={"CUDA_VISIBLE_DEVICES": ""})
    assert_one_line_error(proc, Exit.SKIPPED, "nccl needs one GPU per rank")
    assert verdict["outcome"] == "skipped" and verdict["inputs"]["backend"] == "nccl"


@pytest.mark.mirror
def test_dirty_checkout_is_refused_and_left_as_it_was(tmp_path, checkout):
    stage3 = checkout / STAGE3
    stage3.write_text(stage3.read_text() + "\n# a user's work in progress\n")
    before = repo_state(checkout)
    proc, _ = pipeline(tmp_path, "--src", str(checkout))
    assert_one_line_error(proc, Exit.ERROR, "uncommitted changes")
    assert repo_state(checkout) == before


@pytest.mark.mirror
def test_series_that_does_not_apply_leaves_the_checkout_alone(tmp_path, checkout):
    stage3 = checkout / STAGE3
    text = stage3.read_text()
    assert FIXED_LINE in text
    spaced = FIXED_LINE.replace("averaging_world_size =", "averaging_world_size =  ")
    stage3.write_text(text.replace(FIXED_LINE, spaced))
    subprocess.run([
        "git", "-C",
        str(checkout), "-c", "user.name=A User", "-c", "user.email=user@example.com", "commit", "-q", "-am",
        "a local change on the line the fix touches"
    ], check=True)
    before = repo_state(checkout)
    proc, verdict = pipeline(tmp_path, "--src", str(checkout))
    assert_one_line_error(proc, Exit.SERIES_DOES_NOT_APPLY, "does not apply")
    assert verdict["outcome"] == "series-does-not-apply"
    # Nothing was installed or run: the series is tried before any build.
    assert not verdict["before"] and verdict["deepspeed_before"] is None
    assert repo_state(checkout) == before


@pytest.mark.parametrize("value", ["-5", "0", "soon"])
def test_a_deadline_that_is_not_positive_is_refused_before_anything_runs(tmp_path, value):
    proc, verdict = pipeline(tmp_path, "--timeout", value)
    assert_one_line_error(proc, Exit.ERROR, "--timeout")
    assert verdict == {}  # not even a verdict: nothing ran


def test_a_wrong_transformers_for_the_alst_steps_is_refused_before_any_download(tmp_path):
    """transformers 5.24 in the job's env (not the pinned 4.57.6): the ALST steps would fail in the ranks,
    minutes later. Its version is what ``importlib.metadata`` reads: a dist-info of 5.24.0 first on the path."""
    site = tmp_path / "site"
    (site / "transformers").mkdir(parents=True)
    (site / "transformers" / "__init__.py").write_text("")
    info = site / "transformers-5.24.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.24.0\n")
    cache = tmp_path / "cache"
    proc, verdict = pipeline(tmp_path, "--version", "0.19.8", env={
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
        "ZERO3_SP_CACHE": str(cache)
    })
    pin = (ROOT / "requirements" / "alst.txt").read_text().split("transformers==", 1)[1].split()[0]
    assert_one_line_error(proc, Exit.ERROR, f"transformers=={pin}", "5.24.0")
    assert verdict["error_exit"] == Exit.ERROR and not cache.exists()
