"""Shared options and fixtures: the twin switch, the real manifest, the mirror (skip when absent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from patch_and_test.core import source  # noqa: E402
from patch_and_test.core.series import Manifest, load_manifest, parse_version  # noqa: E402

# The versions the package supports and proves on PyPI sdists: the lock file's, oldest first.
SUPPORTED_PYPI = tuple(sorted(source.load_lock(), key=parse_version))
# Their tags in the mirror (0.19.6 and later exist only on PyPI), plus the mirror's master.
SUPPORTED_TAGS = ("v0.14.5", "v0.15.4", "v0.16.9", "v0.17.2", "v0.17.5", "v0.17.6", "v0.18.9", "v0.19.4", "master")


def pytest_addoption(parser):
    parser.addoption(
        "--run-twin", action="store_true", default=False,
        help="run the twin of the upstream regression test; it asserts the FIXED behaviour, so it "
        "belongs to a patched DeepSpeed (the pipeline passes this after applying the series)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-twin"):
        return
    skip = pytest.mark.skip(reason="asserts the fixed behaviour: run with --run-twin against a patched DeepSpeed")
    for item in items:
        if item.get_closest_marker("twin"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def manifest() -> Manifest:
    return load_manifest()


@pytest.fixture(scope="session")
def mirror() -> Path:
    path = source.mirror_path()
    if not path.exists():
        pytest.skip(f"no DeepSpeed mirror at {path} (set DEEPSPEED_MIRROR)")
    return path


def tracked_files(*patterns: str) -> list[Path]:
    """The repository's files (tracked, and untracked ones git does not ignore) matching ``patterns``."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
        capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / rel for rel in sorted(set(listed.stdout.splitlines())) if (ROOT / rel).is_file()]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def repo_state(repo: Path, exact: bool = True) -> dict:
    """What a user can see of a repo: branch, HEAD, refs, index, status, files.

    exact: the index byte for byte and the object count too (a repo we must not write to at all);
    otherwise the index entries (a tree we patched and rolled back: git rewrote the index file
    and keeps the objects git am made, which nothing refers to).
    """
    files = {}
    for path in sorted(repo.rglob("*")):
        if ".git" not in path.relative_to(repo).parts and path.is_file():
            files[str(path.relative_to(repo))] = path.read_bytes()
    state = {
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "symbolic-ref", "-q", "HEAD"),
        "refs": git(repo, "for-each-ref"),
        "index": git(repo, "ls-files", "--stage"),
        "status": git(repo, "--no-optional-locks", "status", "--porcelain=v2", "--branch", "--untracked-files=all"),
        "files": files,
    }
    if exact:
        state["index_bytes"] = (repo / ".git" / "index").read_bytes()
        state["objects"] = git(repo, "count-objects", "-v")
    return state
