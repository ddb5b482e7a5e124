"""source / series / reroll with real git on a small synthetic DeepSpeed-shaped repo (seconds).

The repo mimics what matters: version.txt, a stage3.py with __avg_scatter_grads, a tests/ folder,
and a blob missing from the object store, as in the snapshot mirror.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from patch_and_test.core import errors
from patch_and_test.tools import reroll
from patch_and_test.core import source
from patch_and_test.core.series import Patch, Series, apply_series, load_manifest, tree_has_fix

from tests.conftest import repo_state

pytestmark = pytest.mark.git_tools

STAGE3 = """# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team


class DeepSpeedZeroOptimizer_Stage3:

    def __avg_scatter_grads(self, params_to_reduce):
        grad_partitions_for_rank = [p.grad for p in params_to_reduce]
        return grad_partitions_for_rank
"""
FIXED = STAGE3.replace(
    "        return grad_partitions_for_rank\n",
    "        grad_partitions_for_rank = [g * self.sequence_parallel_size for g in grad_partitions_for_rank]\n"
    "        return grad_partitions_for_rank\n")
AUTHOR = "Ada Lovelace <ada@example.com>"
ENV = {
    **os.environ, "GIT_AUTHOR_NAME": "Ada Lovelace",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Lovelace",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000"
}


def run(repo: Path, *args: str, **kw) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=ENV,
                          **kw).stdout


def write(repo: Path, rel: str, text: str) -> None:
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_text(text)


def make_upstream(repo: Path, test_file: str = "tests/unit/test_zero.py") -> tuple[Path, str]:
    """A DeepSpeed-shaped repo whose blogs/ blob is missing, like the mirror's, with one test file. (path, commit)"""
    repo.mkdir()
    run(repo, "init", "-q", "-b", "master")
    write(repo, "version.txt", "0.19.6\n")
    write(repo, "deepspeed/runtime/zero/stage3.py", STAGE3)
    write(repo, test_file, "def test():\n    pass\n")
    write(repo, "blogs/big.jpg", "a large image\n")
    run(repo, "add", "-A")
    run(repo, "commit", "-q", "-m", "upstream")
    blob = run(repo, "rev-parse", "HEAD:blogs/big.jpg").strip()
    commit = run(repo, "rev-parse", "HEAD").strip()
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # the snapshot lacks it
    return repo, commit


@pytest.fixture
def upstream(tmp_path) -> tuple[Path, str]:
    """make_upstream's repo. (path, commit)"""
    return make_upstream(tmp_path / "upstream")


def commit_files(repo: Path, message: str, files: dict[str, str], signoff: bool = True) -> None:
    """Write the files and commit them all (signed off unless asked not to)."""
    for rel, text in files.items():
        write(repo, rel, text)
    run(repo, "add", "-A")
    run(repo, "commit", "-q", *(["-s"] if signoff else []), "-m", message)


def make_branch(upstream_repo: Path, commit: str, dest: Path) -> Path:
    """A developer's clone: sparse "drop blogs/" commit, then a signed-off fix and test."""
    source.clone_shared(upstream_repo, dest)
    local_base, dropped = source.prepare_working_copy(dest, commit, "work")
    assert dropped == ("blogs/big.jpg", )
    write(dest, "deepspeed/runtime/zero/stage3.py", FIXED)
    run(dest, "commit", "-q", "-a", "-s", "-m", "Scale by sp\n\nFixes: 000000000000 (\"x\")")
    write(dest, "tests/unit/test_zero.py", "def test():\n    assert True\n")
    run(dest, "commit", "-q", "-a", "-s", "-m", "Test sp")
    return dest


MANIFEST = """schema = 1

[[series]]
name = "demo"
version = 1
min_version = "0.19.3"
below_version = "0.20.0"
base_commit = "{commit}"
base_ref = "master"
cover_letter = "0000-cover-letter.patch"
patches = [
]
"""


@pytest.fixture
def dev(upstream, tmp_path) -> Path:
    """The developer's clone (make_branch): branch "work" with the fix and the test on the upstream commit."""
    repo, commit = upstream
    return make_branch(repo, commit, tmp_path / "dev")


@pytest.fixture
def series_files(upstream, tmp_path) -> tuple[Path, Path]:
    """A manifest with an empty "demo" series on the upstream commit, and a cover letter text. (manifest, cover)"""
    _, commit = upstream
    manifest = tmp_path / "patches" / "series.toml"
    manifest.parent.mkdir()
    manifest.write_text(MANIFEST.format(commit=commit))
    cover = tmp_path / "cover.txt"
    cover.write_text("Scale by sp\n\nWhy and how.\n")
    return manifest, cover


@pytest.fixture
def user_checkout(upstream, tmp_path) -> Path:
    """A user's plain clone of the upstream repo, on a branch "mine" at its commit."""
    repo, commit = upstream
    user = tmp_path / "user"
    source.clone_shared(repo, user)
    source.prepare_working_copy(user, commit, "mine")
    return user


def tree_with_docs(repo: Path, commit: str, cache: Path) -> source.SourceTree:
    """A fresh working copy of the upstream commit with a docs/ folder committed on top."""
    tree = source.from_mirror(commit, mirror=repo, cache=cache)
    commit_files(tree.path, "docs", {"docs/index.md": "docs\n"}, signoff=False)
    return tree


def test_reroll_v1_then_v2_with_range_diff(upstream, dev, series_files, tmp_path):
    _, commit = upstream
    manifest, cover = series_files

    first = reroll.reroll(dev, "work", "demo", 1, cover=cover, manifest_path=manifest)
    names = [p.name for p in first.files]
    assert names == ["0000-cover-letter.patch", "0001-Scale-by-sp.patch", "0002-Test-sp.patch"]
    assert len(first.scaffolding) == 1 and first.range_diff is None
    letter = first.files[0].read_text()
    assert "Subject: [PATCH v1 0/2] Scale by sp" in letter and "Why and how." in letter
    assert f"base-commit: {commit}\nchange-id: {first.change_id}\n" in letter and first.local_base not in letter
    assert first.change_id.endswith("-zero3-sp-grad-scale-demo-" + first.change_id.rsplit("-", 1)[1])
    loaded = load_manifest(manifest).by_name("demo")
    assert [(p.file, p.role) for p in loaded.patches] == [(names[1], "fix"), (names[2], "test")]

    # Rework the fix, reroll as v2: cover text reused, range-diff against the rebuilt v1.
    run(dev, "reset", "-q", "--hard", "work~2")
    write(dev, "deepspeed/runtime/zero/stage3.py",
          FIXED.replace("g * self.sequence_parallel_size", "g * float(self.sequence_parallel_size)"))
    run(dev, "commit", "-q", "-a", "-s", "-m", "Scale by sp\n\nFixes: 000000000000 (\"x\")")
    write(dev, "tests/unit/test_zero.py", "def test():\n    assert True\n")
    run(dev, "commit", "-q", "-a", "-s", "-m", "Test sp")

    second = reroll.reroll(dev, "work", "demo", 2, manifest_path=manifest)
    assert second.range_diff is not None and second.change_id == first.change_id  # one series, one identity
    diff = second.range_diff
    assert "1:" in diff and "! 1:" in diff and "= 2:" in diff and "float(self.sequence_parallel_size)" in diff
    letter = second.files[0].read_text()
    assert "Subject: [PATCH v2 0/2] Scale by sp" in letter and "Why and how." in letter
    assert "Range-diff against v1:" in letter and f"base-commit: {commit}\n" in letter
    assert load_manifest(manifest).by_name("demo").version == 2
    # The range-diff lives in the letter only (b4's way), not in a file beside it.
    assert sorted(p.name for p in (tmp_path / "patches" / "demo").iterdir()) == names


def test_reroll_refuses_unsigned_and_mixed_commits(dev, series_files, tmp_path):
    manifest, cover = series_files
    commit_files(dev, "mixed, unsigned", {"deepspeed/x.py": "x = 1\n", "docs/x.md": "x\n"}, signoff=False)
    with pytest.raises(errors.BadInput, match="not signed off"):
        reroll.reroll(dev, "work", "demo", 1, cover=cover, manifest_path=manifest, out=tmp_path / "out")
    run(dev, "commit", "-q", "--amend", "-s", "--no-edit")
    with pytest.raises(errors.BadInput, match="split it"):
        reroll.reroll(dev, "work", "demo", 1, cover=cover, manifest_path=manifest, out=tmp_path / "out")


def test_fix_with_test_edits_is_a_fix_and_applies_without_tests(upstream, series_files, tmp_path):
    """A fix commit that also edits an existing test stays role fix; a tree without tests/ gets the code only."""
    repo, commit = upstream
    manifest, cover = series_files
    dev = tmp_path / "dev"
    source.clone_shared(repo, dev)
    source.prepare_working_copy(dev, commit, "work")
    edits = {"deepspeed/runtime/zero/stage3.py": FIXED, "tests/unit/test_zero.py": "def test():\n    assert True\n"}
    commit_files(dev, "Scale by sp, keep the unit test green", edits)
    reroll.reroll(dev, "work", "demo", 1, cover=cover, manifest_path=manifest)
    series = load_manifest(manifest).by_name("demo")
    assert [p.role for p in series.patches] == ["fix"] and series.fix_patches == series.patches

    # A tree with tests/: the whole patch applies.
    tree = source.from_mirror(commit, mirror=repo, cache=tmp_path / "cache")
    assert apply_series(tree.path, series).applied == (series.patches[0].file, )
    assert (tree.path / "tests/unit/test_zero.py").read_text() == "def test():\n    assert True\n"

    # A tree without tests/ (like a PyPI sdist): the fix applies, its tests/ hunk is left out.
    tree = source.from_mirror(commit, mirror=repo, cache=tmp_path / "cache")
    run(tree.path, "rm", "-r", "-q", "tests")
    run(tree.path, "commit", "-q", "-m", "no tests")
    assert apply_series(tree.path, series).applied == (series.patches[0].file, )
    assert tree_has_fix(tree.path) and not (tree.path / "tests").exists()
    assert run(tree.path, "status", "--porcelain") == ""


def test_companion_role_reroll_and_apply(upstream, dev, series_files, tmp_path):
    """A commit touching only tests/ and docs/ is a companion: rerolled as such, skipped without docs/."""
    repo, commit = upstream
    manifest, cover = series_files
    commit_files(dev, "Companion", {
        "docs/tutorial.md": "backprop each rank's own share\n",
        "tests/unit/test_zero.py": "def test():\n    assert 1\n"
    })
    result = reroll.reroll(dev, "work", "demo", 1, cover=cover, manifest_path=manifest)
    assert "Subject: [PATCH v1 0/3] Scale by sp" in result.files[0].read_text()
    series = load_manifest(manifest).by_name("demo")
    assert [p.role for p in series.patches] == ["fix", "test", "companion"]
    assert series.test_patches == series.patches[1:] and series.companion_patches == series.patches[2:]

    # A tree with tests/ but no docs/: the companion is skipped, and says why.
    tree = source.from_mirror(commit, mirror=repo, cache=tmp_path / "cache")
    assert tree.has_tests and not (tree.path / "docs").exists()
    applied = apply_series(tree.path, series)
    assert applied.applied == tuple(p.file for p in series.patches[:2])
    (skip, ) = applied.skipped
    assert skip.file == series.patches[2].file
    assert "needs tests/ and docs/" in skip.reason and "no docs/" in skip.reason

    # With docs/ the whole series applies.
    tree = tree_with_docs(repo, commit, tmp_path / "cache")
    assert apply_series(tree.path, series).applied == tuple(p.file for p in series.patches)

    # docs/ together with code is refused like tests/ with code.
    commit_files(dev, "mixed", {"docs/tutorial.md": "changed\n", "deepspeed/x.py": "x = 1\n"})
    with pytest.raises(errors.BadInput, match="split it"):
        reroll.reroll(dev, "work", "demo", 2, manifest_path=manifest, out=tmp_path / "out")


def test_alst_test_alone_is_a_companion(dev, series_files):
    """Where a release has no tutorial the companion changes only the ALST test: still a companion."""
    manifest, cover = series_files
    commit_files(dev, "Companion, test only",
                 {"tests/unit/ulysses_alst/test_ulysses_sp_hf.py": "def test():\n    assert 2\n"})
    reroll.reroll(dev, "work", "demo", 1, cover=cover, manifest_path=manifest)
    assert [p.role for p in load_manifest(manifest).by_name("demo").patches] == ["fix", "test", "companion"]


def test_reroll_help_documents_usage(capsys):
    with pytest.raises(SystemExit) as done:
        reroll.main(["--help"])
    text = capsys.readouterr().out
    assert done.value.code == 0 and "--reroll-count" in text and "range-diff" in text and "examples:" in text


def _series(tmp_path: Path, patches: list[Path], roles: list[str]) -> Series:
    return Series(name="demo", version=1, min_version=(0, 19, 3), below_version=(0, 20, 0), base_commit="0" * 40,
                  base_ref="master", directory=tmp_path, cover_letter=tmp_path / "0000-cover-letter.patch",
                  patches=tuple(Patch(p.name, p, r) for p, r in zip(patches, roles)))


def format_patches(repo: Path, rev_range: str, out: Path) -> list[Path]:
    run(repo, "format-patch", "-q", "-o", str(out), rev_range)
    return sorted(out.glob("*.patch"))


def test_user_checkout_is_untouched_by_success_and_failure(dev, user_checkout, tmp_path):
    good = format_patches(dev, "work~2..work", tmp_path / "good")
    # The "user checkout": a plain clone with an extra branch, an ignored file, and its index as git left it.
    user = user_checkout
    run(user, "branch", "other")
    write(user, ".git/info/exclude", "*.log\n")
    write(user, "build.log", "ignored\n")
    before = repo_state(user)

    cache = tmp_path / "cache"
    copy = source.from_checkout(user, "demo", cache=cache)
    assert copy.path != user and cache in copy.path.parents and copy.origin == "checkout"
    assert copy.dropped_paths == () and copy.upstream_commit == run(user, "rev-parse", "HEAD").strip()
    result = apply_series(copy.path, _series(tmp_path / "good", good, ["fix", "test"]))
    assert len(result.applied) == 2 and tree_has_fix(copy.path)
    assert repo_state(user) == before

    # A second copy; this series fails at its 2nd patch: the copy is rolled back, the user's repo untouched.
    bad_patch = tmp_path / "bad" / "0002-bad.patch"
    bad_patch.parent.mkdir()
    bad_patch.write_text(good[1].read_text().replace("-    pass", "-    nothing here"))
    copy = source.from_checkout(user, "demo", cache=cache)
    state = repo_state(copy.path, exact=False)
    with pytest.raises(errors.SeriesDoesNotApply, match="0002-bad.patch") as caught:
        apply_series(copy.path, _series(tmp_path, [good[0], bad_patch], ["fix", "fix"]))
    assert "\n" not in str(caught.value)
    assert repo_state(copy.path, exact=False) == state
    assert repo_state(user) == before


def test_two_jobs_at_once_get_their_own_working_copies(dev, user_checkout, tmp_path):
    """A held copy is never handed out again: the second job patches a copy of its own."""
    series = _series(tmp_path / "good", format_patches(dev, "work~2..work", tmp_path / "good"), ["fix", "test"])
    user = user_checkout
    cache = tmp_path / "cache"

    first = source.from_checkout(user, "demo", cache=cache)
    second = source.from_checkout(user, "demo", cache=cache)
    assert second.path != first.path and second.base == first.base
    apply_series(first.path, series)
    assert tree_has_fix(first.path) and not tree_has_fix(second.path)
    assert run(second.path, "rev-parse", "HEAD").strip() == second.base

    # Released (the job ended): the next job gets the first copy back, reset to the user's HEAD.
    first.release()
    third = source.from_checkout(user, "demo", cache=cache)
    assert third.path == first.path and not tree_has_fix(third.path)
    second.release()
    third.release()


def test_checkout_with_missing_blobs_gets_a_sparse_copy(upstream, tmp_path):
    repo, commit = upstream
    # A user checkout that still has the unreadable path checked in: ask the upstream repo itself.
    copy = source.from_mirror(commit, mirror=repo, cache=tmp_path / "cache")
    assert copy.dropped_paths == ("blogs/big.jpg", ) and not (copy.path / "blogs").exists()
    assert run(copy.path, "rev-parse", "HEAD~1").strip() == commit and copy.has_tests


def test_refusals(user_checkout, tmp_path):
    with pytest.raises(errors.NotACheckout, match="not a git work tree"):
        source.from_checkout(tmp_path)
    with pytest.raises(errors.NotACheckout, match="not a directory"):
        apply_series(tmp_path / "absent", _series(tmp_path, [], []))
    other = tmp_path / "other"
    other.mkdir()
    run(other, "init", "-q")
    commit_files(other, "x", {"README": "x\n"}, signoff=False)
    with pytest.raises(errors.NotACheckout, match="not a DeepSpeed checkout"):
        source.from_checkout(other)
    user = user_checkout
    with pytest.raises(errors.NotACheckout, match="pass its root"):
        apply_series(user / "deepspeed", _series(tmp_path, [], []))
    write(user, "deepspeed/runtime/zero/stage3.py", FIXED)
    with pytest.raises(errors.DirtyCheckout, match="uncommitted changes"):
        source.from_checkout(user)
    with pytest.raises(errors.DirtyCheckout):
        apply_series(user, _series(tmp_path, [], []))
    run(user, "checkout", "-q", "--", ".")
    write(user, "untracked.py", "x = 1\n")
    with pytest.raises(errors.DirtyCheckout, match="untracked.py"):
        apply_series(user, _series(tmp_path, [], []))
    (user / "untracked.py").unlink()
    write(user, "deepspeed/runtime/zero/stage3.py", FIXED)
    run(user, "commit", "-q", "-a", "-m", "fixed upstream one day")
    with pytest.raises(errors.AlreadyFixed, match="already accounts"):
        apply_series(user, _series(tmp_path, [], []))


def test_an_sdist_repo_keeps_build_txt_in_a_folder_of_its_layout(tmp_path):
    """The sdist's empty build.txt tells DeepSpeed's setup.py it builds a release: kept, a build says 9.9.9, not
    9.9.9+unknown (setup.py's git hash of an export without .git). The repo is made in its layout's folder, beside
    (not over) a repo an older package made, whose working copies read its objects."""
    import hashlib
    import tarfile

    tree = tmp_path / "deepspeed-9.9.9"
    write(tree, "version.txt", "9.9.9\n")
    write(tree, "build.txt", "")
    write(tree, "deepspeed/runtime/zero/stage3.py", STAGE3)
    cache = tmp_path / "cache"
    (cache / "sdists").mkdir(parents=True)
    archive = cache / "sdists" / "deepspeed-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    lock = {"9.9.9": source.LockEntry("9.9.9", archive.name, hashlib.sha256(archive.read_bytes()).hexdigest())}
    old = cache / "pypi" / "deepspeed-9.9.9"  # where the package made it before build.txt was kept
    write(old, "untouched", "")

    copy = source.from_pypi("9.9.9", cache=cache, lock=lock)
    assert run(copy.path, "ls-files", "build.txt").strip() == "build.txt"
    assert (cache / "pypi" / f"v{source.SDIST_LAYOUT}" / "deepspeed-9.9.9" / ".git").is_dir()
    assert (old / "untouched").exists()
    copy.release()
