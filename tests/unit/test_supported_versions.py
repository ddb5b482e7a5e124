"""deepspeed-sdists.lock is the one list of supported releases; what cannot read it must agree with it."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from patch_and_test.core.series import parse_version
from patch_and_test.core.source import load_lock

ROOT = Path(__file__).resolve().parents[2]
LOCKED = sorted(load_lock(), key=parse_version)


def _braced(text: str, prefix: str) -> list[list[str]]:
    """Every ``<prefix>{a,b,c}`` in text, as lists."""
    return [group.split(",") for group in re.findall(re.escape(prefix) + r"\{([^}]*)\}", text)]


def test_tox_envs_cover_exactly_the_locked_versions():
    tox = (ROOT / "tox.ini").read_text()
    matrices = _braced(tox, "patch-and-test-ds")
    assert matrices and all(sorted(m, key=parse_version) == LOCKED for m in matrices), matrices
    # the fast tier: newest and oldest
    assert _braced(tox, "tests-ds") == [[LOCKED[-1], LOCKED[0]]]
    assert f"tests = tests-ds{LOCKED[-1]}, tests-ds{LOCKED[0]}" in tox
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(tox)
    setenv = ini["testenv"]["set_env"]
    pinned = re.findall(r"^ds([\d.]+): DEEPSPEED_VERSION = ([\d.]+)$", setenv, re.M)
    assert [a for a, b in pinned if a == b] == LOCKED and len(pinned) == len(LOCKED)


def test_contributing_names_the_locked_versions():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    line = re.search(r"^Versions come from `deepspeed-sdists.lock`: (.*)\.$", text, re.M)
    assert line and line[1].split(", ") == LOCKED
    assert f"tests-ds{LOCKED[-1]}, tests-ds{LOCKED[0]}" in text
    # and README's "Two commands" names the newest, the default
    assert f"tox -e patch-and-test     # DeepSpeed {LOCKED[-1]} from PyPI" in (ROOT / "README.md").read_text()


def test_noxfile_and_conftest_read_the_lock():
    nox = (ROOT / "noxfile.py").read_text()
    assert "load_lock()" in nox and not re.search(r"['\"]0\.\d+\.\d+['\"]", nox.split('"""', 2)[-1])
    from tests.conftest import SUPPORTED_PYPI

    assert list(SUPPORTED_PYPI) == LOCKED
