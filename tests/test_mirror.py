"""The series on real DeepSpeed history: the git mirror ($DEEPSPEED_MIRROR), skipped without it."""

from __future__ import annotations

import re
import shutil

import pytest

from patch_and_test.tools import lint
from patch_and_test.tools import reroll
from patch_and_test.core import source
from patch_and_test.core.series import (apply_series, load_manifest, parse_version, series_for_tree,
                                        series_for_version, source_has_fix, tree_has_fix)

from tests.conftest import SUPPORTED_TAGS, git

pytestmark = [pytest.mark.mirror, pytest.mark.slow_tier]


def tags_in_range(mirror, manifest) -> list[str]:
    """Every release tag the manifest covers (v0.14.0 ... v0.19.5)."""
    tags = [t for t in git(mirror, "tag", "--list", "v*").split() if re.fullmatch(r"v\d+\.\d+\.\d+", t)]
    covered = [t for t in tags if any(s.covers(parse_version(t)) for s in manifest.series)]
    return sorted(covered, key=parse_version)


@pytest.mark.parametrize("ref", SUPPORTED_TAGS)
def test_series_applies_with_plain_git_am_on_supported_tags(mirror, ref, tmp_path):
    tree = source.from_mirror(ref, mirror, cache=tmp_path)
    assert tree.dropped_paths and all(p.startswith("blogs/") for p in tree.dropped_paths)
    assert not tree_has_fix(tree.path)
    series = series_for_tree(tree.path)
    result = apply_series(tree.path, series)
    assert result.applied == tuple(p.file for p in series.patches) and not result.skipped
    assert tree_has_fix(tree.path)


def test_every_tag_in_range_takes_its_series(mirror, manifest, tmp_path):
    """The ranges in the manifest are what plain git am accepts, tag by tag, in one reused copy."""
    copy = tmp_path / "copy"
    source.clone_shared(mirror, copy)
    failures = []
    for tag in tags_in_range(mirror, manifest):
        source.prepare_working_copy(copy, git(mirror, "rev-parse", f"{tag}^{{commit}}").strip(), "sweep")
        series = series_for_version(tag, manifest)
        try:
            apply_series(copy, series)
        except Exception as exc:  # collect them all, then fail once
            failures.append(f"{tag} ({series.name}): {exc}")
    assert not failures, "\n".join(failures)


ALST_TEST = "tests/unit/ulysses_alst/test_ulysses_sp_hf.py"


def test_every_tag_with_the_alst_test_gets_the_companion(mirror, manifest):
    """The companion must land with the fix wherever the ALST recipe's test exists (from v0.17.2)."""
    tags = [t for t in git(mirror, "tag", "--list", "v*").split() if re.fullmatch(r"v\d+\.\d+\.\d+", t)]
    uncovered = []
    for tag in sorted(tags, key=parse_version):
        if parse_version(tag) < (0, 14, 0):
            continue
        has_alst = ALST_TEST in git(mirror, "ls-tree", "-r", "--name-only", tag, "--", ALST_TEST)
        version = git(mirror, "show", f"{tag}:version.txt")
        covering = [s for s in manifest.series if s.covers(parse_version(version))]
        if not covering:
            uncovered.append(tag)
            continue
        assert bool(covering[0].companion_patches) == has_alst, (tag, covering[0].name)
    # v0.17.2-v0.17.5, v2's gap, have their own series with its own companion variant.
    assert uncovered == []


def test_no_unpatched_release_looks_fixed(mirror, manifest):
    for ref in tags_in_range(mirror, manifest) + ["master"]:
        assert not source_has_fix(git(mirror, "show", f"{ref}:deepspeed/runtime/zero/stage3.py")), ref


def test_series_base_commits_are_real_commits(mirror, manifest, tmp_path):
    """Each base is a commit of the mirror under its ref, or the newest-upstream graft, which the package rebuilds
    with the same id from the mirror and the locked sdist."""
    for series in manifest.series:
        if series.base_ref == source.NEWEST_UPSTREAM:
            tree = source.from_series_base(series, mirror, cache=tmp_path / "cache")
            repo = tree.path
            parent = git(repo, "rev-parse", f"{series.base_commit}^").strip()
            assert parent == source.load_newest_upstream().history
            assert git(mirror, "merge-base", "--is-ancestor", parent, "master") == ""
        else:
            repo = mirror
            assert git(mirror, "rev-parse", f"{series.base_ref}^{{commit}}").strip() == series.base_commit
        # index lines name the blobs of the base commit, or of an earlier patch of the series (the fix edits
        # test_autoep_unit.py and test_coalesced_collectives.py, the marker stage3.py after the fix)
        written: dict[str, str] = {}
        for patch in series.patches:
            for path, blob, new in re.findall(r"^diff --git a/(\S+) .*\nindex ([0-9a-f]+)\.\.([0-9a-f]+)",
                                              patch.path.read_text(), re.M):
                base = written.get(path) or git(repo, "rev-parse", f"{series.base_commit}:{path}")
                assert base.startswith(blob), (patch.file, path)
                written[path] = new


def diff_part(patch_text: str) -> str:
    """A patch without its mail headers and message: diffstat and diff."""
    return patch_text.split("\n---\n", 1)[1]


def test_reroll_round_trip_on_master(mirror, manifest, tmp_path):
    """Rerolling the unchanged master series (vN) as vN+1 gives the same patches and an all-'=' range-diff."""
    master = manifest.by_name("master")
    nxt = master.version + 1
    tree = source.from_series_base(master, mirror, branch="zero3-sp-fix/master", cache=tmp_path / "cache")
    apply_series(tree.path, master)
    work = tmp_path / "patches"
    shutil.copytree(manifest.path.parent, work)
    result = reroll.reroll(tree.path, "zero3-sp-fix/master", "master", nxt, manifest_path=work / "series.toml")
    assert result.scaffolding and result.range_diff is not None
    lines = result.range_diff.splitlines()
    assert len(lines) == 3 and all(" = " in line for line in lines), lines
    letter = result.files[0].read_text()
    assert (f"[PATCH v{nxt} 0/3]" in letter and f"Range-diff against v{master.version}:" in letter
            and f"Changes in v{master.version}:" in letter)
    assert f"base-commit: {master.base_commit}\nchange-id: {result.change_id}\n" in letter
    assert f"change-id: {result.change_id}\n" in master.cover_letter.read_text()  # kept from vN
    for new, old in zip(result.files[1:], master.patches):
        assert diff_part(new.read_text()) == diff_part(old.path.read_text())
    rerolled = load_manifest(work / "series.toml").by_name("master")
    assert rerolled.version == nxt and [p.role for p in rerolled.patches] == ["fix", "test", "companion"]


def test_lint_passes_on_the_mirror(mirror, capsys):
    try:
        for name in lint.TOOLS:
            lint._tool(name)
    except Exception as exc:
        pytest.skip(f"lint tools missing: {exc}")
    assert lint.main([]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    # every series on its base: a mirror commit, or (master, v0.19.8) the newest-upstream tree built from the mirror
    bases = out.count(": sparse checkout of the mirror at ") + out.count(": the newest-upstream tree ")
    assert bases == len(load_manifest().series), out
    assert "finding" not in out and "not linted" not in out


def test_the_newest_upstream_tree_is_the_releases_code_on_masters_tests(mirror, manifest, tmp_path):
    """Rebuilt in a fresh cache it has the same id (the series' base-commit); its code is the sdist's, byte for
    byte, its tests/ and docs/ are master's, and its parent is the lock's master commit."""
    wanted = source.load_newest_upstream()
    repo, graft = source.build_graft(wanted.release, wanted.history, mirror, cache=tmp_path / "cache")
    assert graft.commit == manifest.by_name("master").base_commit == manifest.by_name("v0.19.8").base_commit
    assert git(repo, "rev-parse", f"{graft.commit}^").strip() == wanted.history
    for folder in ("tests", "docs", "blogs"):
        ours = git(repo, "rev-parse", f"{graft.commit}:{folder}")
        assert ours == git(mirror, "rev-parse", f"{wanted.history}:{folder}"), folder
    unpacked = tmp_path / "sdist"
    source._unpack(source.fetch_sdist(wanted.release, cache=tmp_path / "cache"), unpacked)
    listed = git(repo, "ls-tree", "-r", "--name-only", graft.commit, "--", *source.GRAFTED_PATHS).split()
    on_disk = sorted(
        str(p.relative_to(unpacked)) for top in source.GRAFTED_PATHS
        for p in ([unpacked / top] if (unpacked / top).is_file() else (unpacked / top).rglob("*"))
        if p.is_file() and not _build_output(str(p.relative_to(unpacked))))
    assert listed == on_disk
    assert git(repo, "show", f"{graft.commit}:version.txt").strip() == wanted.release
    assert (git(
        repo, "show",
        f"{graft.commit}:deepspeed/runtime/zero/stage3.py") == (unpacked /
                                                                "deepspeed/runtime/zero/stage3.py").read_text())
    assert not tree_has_fix_of(repo, graft.commit)


def _build_output(rel: str) -> bool:  # what the sdist ships that the graft leaves out
    return ("__pycache__" in rel.split("/") or rel.endswith((".pyc", ".so"))
            or rel == "deepspeed/git_version_info_installed.py")


def tree_has_fix_of(repo, commit) -> bool:
    return source_has_fix(git(repo, "show", f"{commit}:deepspeed/runtime/zero/stage3.py"))
