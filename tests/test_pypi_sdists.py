"""Real PyPI sdists: build the sdist repo, git am the fix, refuse what must be refused (network).

The sdists are downloaded once into the cache ($ZERO3_SP_CACHE or ~/.cache/zero3-sp-gradfix) and
checked against deepspeed-sdists.lock; later runs reuse them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

import pytest

from patch_and_test.core import errors
from patch_and_test.core import source
from patch_and_test.core.series import Patch, apply_series, git, parse_version, series_for_tree, tree_has_fix

from tests.conftest import SUPPORTED_PYPI, repo_state

pytestmark = [pytest.mark.network, pytest.mark.slow_tier]


@pytest.mark.parametrize("version", SUPPORTED_PYPI)
def test_fix_applies_to_the_sdist_and_twice_is_already_fixed(version):
    tree = source.from_pypi(version)
    assert tree.origin == "pypi-sdist" and tree.version == version and not tree.has_tests
    assert not tree_has_fix(tree.path), "the released sdist has the bug"
    series = series_for_tree(tree.path)
    result = apply_series(tree.path, series)
    assert result.applied == tuple(p.file for p in series.fix_patches)
    assert [s.file for s in result.skipped] == [p.file for p in series.test_patches]
    assert all("needs tests/" in s.reason for s in result.skipped)
    # Every supported sdist from 0.17.6 on has a companion, skipped like the test.
    assert [s.file for s in result.skipped if "docs/" in s.reason] == [p.file for p in series.companion_patches]
    assert bool(series.companion_patches) == (parse_version(version) >= (0, 17, 6))
    assert tree_has_fix(tree.path) and result.head != result.base
    with pytest.raises(errors.AlreadyFixed):
        apply_series(tree.path, series)


def test_sdist_repo_is_cached_pristine_and_reproducible(tmp_path):
    version = "0.19.8"
    first = source.from_pypi(version)
    apply_series(first.path, series_for_tree(first.path))  # dirty the working copy on purpose
    first.release()
    again = source.from_pypi(version)
    assert again.path == first.path and again.base == first.base and not tree_has_fix(again.path)
    again.release()
    # Rebuilt from the same archive elsewhere: the same commit (fixed author, date, message).
    archive = source.fetch_sdist(version)
    (tmp_path / "sdists").mkdir()
    shutil.copy(archive, tmp_path / "sdists" / archive.name)
    rebuilt = source.from_pypi(version, cache=tmp_path)
    assert rebuilt.base == first.base and rebuilt.path != first.path


def test_two_jobs_at_once_patch_separate_copies():
    """CI ran the tests and a bundle at once: one job's series landed under the other's install."""
    first = source.from_pypi("0.19.8")
    second = source.from_pypi("0.19.8")  # while the first is still held
    try:
        assert second.path != first.path and second.base == first.base
        apply_series(first.path, series_for_tree(first.path))
        assert tree_has_fix(first.path) and not tree_has_fix(second.path)
        assert git(second.path, "rev-parse", "HEAD").stdout.strip() == second.base
    finally:
        first.release()
        second.release()


def test_lock_mismatch_is_refused(tmp_path):
    lock = source.load_lock()
    entry = lock["0.19.8"]
    bad = {"0.19.8": source.LockEntry(entry.version, entry.filename, "0" * 64)}
    archive = source.fetch_sdist("0.19.8")
    (tmp_path / "sdists").mkdir()
    shutil.copy(archive, tmp_path / "sdists" / archive.name)  # a cached file that does not match: re-download
    with pytest.raises(errors.BadInput, match="does not match the lock"):
        source.fetch_sdist("0.19.8", lock=bad, cache=tmp_path)
    with pytest.raises(errors.UnknownVersion, match="no sdist of DeepSpeed 0.13.5"):
        source.fetch_sdist("0.13.5")


def test_failing_series_leaves_the_tree_exactly_as_it_was(manifest):
    tree = source.from_pypi("0.19.8")
    own = series_for_tree(tree.path)  # v0.19.8
    backport = manifest.by_name("v0.14.0-v0.16.1")
    before = repo_state(tree.path, exact=False)
    # 1. The first patch fails: an old backport's fix on a 0.19.8 tree.
    with pytest.raises(errors.SeriesDoesNotApply, match=backport.fix_patches[0].file) as caught:
        apply_series(tree.path, backport)
    assert "\n" not in str(caught.value) and caught.value.exit_code == errors.Exit.SERIES_DOES_NOT_APPLY
    assert repo_state(tree.path, exact=False) == before
    # 2. The second patch fails after the first one was committed: that commit is undone too.
    second = Patch("0002-backport-fix-again.patch", backport.fix_patches[0].path, "fix")
    mixed = dataclasses.replace(own, patches=(own.fix_patches[0], second))
    with pytest.raises(errors.SeriesDoesNotApply, match="0002-backport-fix-again.patch"):
        apply_series(tree.path, mixed)
    assert repo_state(tree.path, exact=False) == before
    leftover = subprocess.run(["git", "-C", str(tree.path), "am", "--show-current-patch"], capture_output=True)
    assert leftover.returncode != 0, "no git am session is left behind"


def test_dirty_tree_and_non_checkout_are_refused(manifest, tmp_path):
    tree = source.from_pypi("0.18.9")
    series = series_for_tree(tree.path)
    stage3 = tree.path / "deepspeed/runtime/zero/stage3.py"
    original = stage3.read_text()
    stage3.write_text(original + "\n# local edit\n")
    try:
        with pytest.raises(errors.DirtyCheckout, match="stage3.py"):
            apply_series(tree.path, series)
    finally:
        stage3.write_text(original)
    assert apply_series(tree.path, series).applied  # clean again: it applies
    with pytest.raises(errors.NotACheckout, match="not a git work tree"):
        apply_series(tmp_path, series)
    with pytest.raises(errors.NotACheckout, match="pass its root"):
        apply_series(tree.path / "deepspeed", series)


def test_user_checkout_stays_byte_identical(manifest, tmp_path):
    """A fake user checkout made from an sdist: their repo is only read, on success and on failure."""
    sdist = source.from_pypi("0.19.8")
    user = tmp_path / "user-deepspeed"
    shutil.copytree(sdist.path, user, ignore=shutil.ignore_patterns(".git"))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m",
                                                               "my DeepSpeed"], ["branch", "experiment"]):
        subprocess.run(["git", "-C", str(user), *args], check=True, capture_output=True, env={
            **os.environ,
            **source.FIXED_IDENTITY
        })
    (user / "notes.log").write_text("ignored by the user\n")
    (user / ".git" / "info" / "exclude").write_text("*.log\n")
    subprocess.run(["git", "-C", str(user), "status"], check=True, capture_output=True)  # settle the index
    before = repo_state(user)

    cache = tmp_path / "cache"
    copy = source.from_checkout(user, cache=cache)
    assert copy.origin == "checkout" and copy.branch == "zero3-sp-fix/v0.19.8" and not copy.has_tests
    result = apply_series(copy.path, series_for_tree(copy.path))
    assert tree_has_fix(copy.path) and result.applied
    assert repo_state(user) == before

    copy = source.from_checkout(user, cache=cache)  # the same copy, back at the user's HEAD
    assert not tree_has_fix(copy.path)
    with pytest.raises(errors.SeriesDoesNotApply):
        apply_series(copy.path, manifest.by_name("v0.18.4-v0.18.9"))
    assert repo_state(user) == before


def test_lint_falls_back_to_sdists_without_a_mirror(monkeypatch, tmp_path, capsys):
    from patch_and_test.tools import lint
    try:
        for name in lint.TOOLS:
            lint._tool(name)
    except errors.BadInput as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("DEEPSPEED_MIRROR", str(tmp_path / "no-mirror"))
    assert lint.main([]) == 0
    out = capsys.readouterr().out
    # Nine series; v0.17.2-v0.17.5 and v0.19.0-v0.19.2 have no locked sdist (and say so), the other seven
    # are linted on one (master, made on the newest-upstream tree, on that tree's release).
    assert out.count("PyPI sdist of DeepSpeed") == 7 and "series master: PyPI sdist of DeepSpeed 0.19.8" in out
    assert out.count("the test patches were not linted") == 7 and "finding" not in out
    assert out.count("NOT LINTED") == 2 and "series v0.19.0-v0.19.2: NOT LINTED" in out
    assert "series v0.17.2-v0.17.5: NOT LINTED" in out
