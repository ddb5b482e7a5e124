"""deepspeed-sdists.lock is the one list of supported releases; what cannot read it must agree with it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from patch_and_test.core.series import parse_version
from patch_and_test.core.source import load_lock

ROOT = Path(__file__).resolve().parents[2]
LOCKED = sorted(load_lock(), key=parse_version)


def _tox(*args: str) -> str:
    tox = [sys.executable, "-m", "tox", "--no-provision", "-x", "tox.requires=tox"]  # tox-uv may be missing here
    if importlib.util.find_spec("tox") is None:
        pytest.skip("tox is not installed")
    # TOX_* of a tox env that runs these tests would be taken for options.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOX_")}
    done = subprocess.run([*tox, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_tox_ini_names_no_version():
    tox = (ROOT / "tox.ini").read_text()
    assert not re.findall(r"\d+\.\d+\.\d+", tox)  # toxfile.py gives tox every version, from the lock
    assert tox.count("patch-and-test-ds{{deepspeed_versions}}-{gloo,nccl}") == 2  # env_list and the matrix label
    assert "tests = tests-ds{deepspeed_newest}, tests-ds{deepspeed_oldest}" in tox


def test_toxfile_reads_the_lock(tmp_path):
    toxfile = pytest.importorskip("toxfile")
    assert toxfile.locked_versions() == LOCKED
    lock = tmp_path / "lock"
    lock.write_text('[sdist."1.10.0"]\n[sdist."1.9.2"]\n[newest-upstream]\nrelease = "1.10.0"\n')
    assert toxfile.locked_versions(lock) == ["1.9.2", "1.10.0"]  # by number, not as text
    assert toxfile.env_deepspeed_version("patch-and-test-ds1.9.2-gloo") == "1.9.2"
    assert toxfile.env_deepspeed_version("tests-ds1.10.0") == "1.10.0"
    assert toxfile.env_deepspeed_version("patch-and-test-newest") is None
    assert toxfile.env_deepspeed_version("downstream-tf5.25") is None


def test_tox_resolves_the_locked_versions():
    cells = [f"patch-and-test-ds{v}-{b}" for v in LOCKED for b in ("gloo", "nccl")]
    tests = [f"tests-ds{LOCKED[-1]}", f"tests-ds{LOCKED[0]}"]
    listed = [line.split()[0] for line in _tox("-l").splitlines() if line.strip()]
    assert [e for e in listed if "-ds" in e] == cells + tests
    # `tox -m tests`: newest (with the ALST requirements) and oldest (without), each with its DEEPSPEED_VERSION
    newest, oldest = _tox("config", "-m", "tests", "-k", "set_env", "deps").split("[testenv:")[1:]
    assert newest.startswith(tests[0]) and oldest.startswith(tests[1])
    assert f"DEEPSPEED_VERSION={LOCKED[-1]}\n" in newest and "-r requirements/alst.txt" in newest
    assert f"DEEPSPEED_VERSION={LOCKED[0]}\n" in oldest and "alst" not in oldest
    plain, cell = _tox("config", "-e", f"patch-and-test,{cells[2]}", "-k", "set_env", "deps").split("[testenv:")[1:]
    assert "DEEPSPEED_VERSION" not in plain and "-r requirements/alst.txt" in plain
    assert f"DEEPSPEED_VERSION={LOCKED[1]}\n" in cell and "ZERO3_SP_BACKEND=gloo" in cell


def test_contributing_names_the_locked_versions():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    line = re.search(r"^Versions come from `deepspeed-sdists.lock`: (.*)\.$", text, re.M)
    assert line and line[1].split(", ") == LOCKED
    assert f"tests-ds{LOCKED[-1]}, tests-ds{LOCKED[0]}" in text
    # and README's "Two commands" names the newest, the default
    assert f"tox -e patch-and-test     # DeepSpeed {LOCKED[-1]} from PyPI" in (ROOT / "README.md").read_text()


def test_noxfile_and_conftest_read_the_lock():
    nox = (ROOT / "noxfile.py").read_text()
    assert "load_lock()" in nox and not re.findall(r"\d+\.\d+\.\d+", nox)  # not even in its docstring
    from tests.conftest import SUPPORTED_PYPI

    assert list(SUPPORTED_PYPI) == LOCKED
