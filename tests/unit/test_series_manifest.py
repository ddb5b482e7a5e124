"""Manifest parsing and version -> series selection (fast, no git)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from patch_and_test import errors
from patch_and_test.series import load_manifest, parse_version, series_for_tree, series_for_version

EXPECTED = {
    "0.14.0": "v0.14.0-v0.17.1",
    "0.14.5": "v0.14.0-v0.17.1",
    "0.15.4": "v0.14.0-v0.17.1",
    "0.16.9": "v0.14.0-v0.17.1",
    "0.17.1": "v0.14.0-v0.17.1",  # still tests/unit/runtime/zero/test_zero.py, no ALST test yet
    "0.17.2": "v0.17.2-v0.17.5",  # the ALST test from here; the tutorial from 0.17.3
    "0.17.5": "v0.17.2-v0.17.5",
    "0.17.6": "v0.17.6-v0.18.3",
    "0.17.7": "v0.17.6-v0.18.3",  # tag v0.18.0's version.txt
    "0.18.3": "v0.17.6-v0.18.3",
    "0.18.4": "v0.18.4-v0.18.9",
    "0.18.9": "v0.18.4-v0.18.9",
    "0.19.0": "v0.19.0-v0.19.2",
    "0.19.2": "v0.19.0-v0.19.2",
    "0.19.3": "master",  # the averaging_world_size rescale exists from here
    "0.19.4": "master",
    "0.19.6": "master",  # the mirror's master says 0.19.6
    "0.19.7": "master",
    "0.19.8": "v0.19.8",  # no LoCo branch in __avg_scatter_grads: master's patch 1 does not apply
}
SERIES = ["v0.14.0-v0.17.1", "v0.17.2-v0.17.5", "v0.17.6-v0.18.3", "v0.18.4-v0.18.9", "v0.19.0-v0.19.2", "master",
          "v0.19.8"]
WITH_COMPANION = SERIES[1:]


@pytest.mark.parametrize("version,name", sorted(EXPECTED.items()))
def test_every_supported_version_has_its_series(manifest, version, name):
    assert series_for_version(version, manifest).name == name


@pytest.mark.parametrize("version", ["0.19.6", "0.19.6+fe7b53c59", "0.19.6.dev0", "v0.19.5", " 0.19.6\n"])
def test_master_and_dev_versions_map_to_master(manifest, version):
    # DeepSpeed's master says 0.19.6 in version.txt while v0.19.5 is the newest tag.
    assert series_for_version(version, manifest).name == "master"


@pytest.mark.parametrize("version", ["0.13.5", "0.11.2", "0.20.0", "1.0.0"])
def test_unknown_versions_are_refused_with_the_supported_range(manifest, version):
    with pytest.raises(errors.UnknownVersion) as caught:
        series_for_version(version, manifest)
    message = str(caught.value)
    assert "\n" not in message
    assert version in message and ">=0.14.0,<0.20.0" in message
    assert caught.value.exit_code == errors.Exit.ERROR


@pytest.mark.parametrize("version", ["0.17.2", "0.17.3", "0.17.4", "0.17.5"])
def test_former_gap_is_served(manifest, version):
    # v2 left 0.17.2-0.17.5 out (no companion variant applied there); they have their own series now.
    assert series_for_version(version, manifest).name == "v0.17.2-v0.17.5"
    assert "NOT COVERED" not in manifest.path.read_text()


@pytest.mark.parametrize("text", ["", "master", "0.19", "abc.def.ghi"])
def test_unreadable_versions(manifest, text):
    with pytest.raises(errors.UnknownVersion):
        series_for_version(text, manifest)


def test_parse_version():
    assert parse_version("0.19.6+fe7b53c59") == (0, 19, 6)
    assert parse_version("v0.14.5") == (0, 14, 5)
    assert parse_version("0.19.6rc1") == parse_version("0.19.6.post2") == (0, 19, 6)


@pytest.mark.parametrize("text", ["0.19.6garbage", "0.19.6.1", "0.19.6 and more", "0.19.6/x", "1!0.19.6"])
def test_parse_version_is_pep440_not_a_prefix_match(text):
    # packaging.version.Version reads the whole string: a version with trailing text is not one.
    with pytest.raises(errors.UnknownVersion):
        parse_version(text)


def test_manifest_shape(manifest):
    assert [s.name for s in manifest.series] == SERIES
    for series in manifest.series:
        assert series.version >= 1
        assert re.fullmatch(r"[0-9a-f]{40}", series.base_commit)
        roles = ["fix", "test", "companion"] if series.name in WITH_COMPANION else ["fix", "test"]
        assert [p.role for p in series.patches] == roles
        assert [p.file[:5] for p in series.patches] == [f"000{i}-" for i in range(1, len(roles) + 1)]
        assert series.fix_patches == series.patches[:1] and series.test_patches == series.patches[1:]
        assert all(p.path.is_file() for p in series.patches)
        # The cover letter names the same real upstream commit as the manifest.
        letter = series.cover_letter.read_text()
        assert f"base-commit: {series.base_commit}\n" in letter
        assert f"[PATCH v{series.version} 0/{len(roles)}]" in letter
    # Contiguous ranges: every release from 0.14.0 to 0.19.x has a series.
    for lower, upper in zip(manifest.series, manifest.series[1:]):
        assert lower.below_version == upper.min_version, (lower.name, upper.name)


MARKER = ("+# ZeRO-3 sums gradients over the sequence-parallel ranks on every reduction path (#8692). Client code\n"
          "+# that scales its sp loss for older releases can test this instead of comparing version numbers.\n"
          "+ZERO3_SP_GRADIENTS_SUMMED = True\n")


def test_v3_series_carry_the_marker_the_4_rank_test_and_the_companion(manifest):
    for series in manifest.series:
        new = series.name in ("v0.17.2-v0.17.5", "v0.19.8")  # first version; the others were rerolled from v2
        # master v4: the fix divides before the reduce-scatter instead of rescaling afterwards
        assert series.version == (1 if new else 4 if series.name == "master" else 3), series.name
        fix = series.fix_patches[0].path.read_text()
        assert MARKER in fix and "ZERO3_SP_GRADIENTS_SUMMED" in fix.split("\n---\n")[0], series.name
        assert "Reported-by: alanhuangyoo (GitHub)" in fix and "Fixes: ec029e7625ae" in fix
        test = series.patches[1].path.read_text()
        assert "+    def test_sp2_dp2(self, reduce_scatter, contiguous_gradients, reduce_bucket_size):" in test
        assert "+    @pytest.mark.world_size(4)" in test
        letter = series.cover_letter.read_text()
        if not new:
            assert (f"Changes in v{series.version}:" in letter and "Changes in v3:" in letter
                    and f"Range-diff against v{series.version - 1}:" in letter)
        assert not list(series.directory.glob("range-diff-*")), "the range-diff lives in the cover letter only"
        assert "@TESTS@" not in letter and "@COMPANION@" not in letter and "***" not in letter
        if series.name in WITH_COMPANION:
            (companion, ) = series.companion_patches
            assert companion.needs_tests and companion.needs_dirs == ("tests", "docs")


def test_master_fix_keeps_the_autoep_unit_test_green(manifest):
    # That test builds the optimizer with object.__new__ (v0.19.3 on): the fix commit sets the
    # attribute it now reads, and the test commit adds the sp=2 case of the same kind.
    master = manifest.by_name("master")
    fix, test = (p.path.read_text() for p in master.patches[:2])
    assert "+++ b/tests/unit/v1/moe/test_autoep_unit.py" in fix
    assert "+        optimizer.sequence_parallel_size = 1" in fix
    assert "+    def test_zero3_reduce_scatter_grads_sum_over_sequence_parallel(self, monkeypatch):" in test
    for series in manifest.series:
        # v0.19.8 carries master's v3 patches (their fix sets the attribute too); older releases lack the test
        if series.name not in ("master", "v0.19.8"):
            assert "test_autoep_unit.py" not in series.fix_patches[0].path.read_text(), series.name


def test_patches_touch_only_what_their_role_allows(manifest):
    for series in manifest.series:
        for patch in series.patches:
            paths = re.findall(r"^\+\+\+ b/(.+)$", patch.path.read_text(), re.M)
            assert paths, patch.file
            tops = {p.split("/", 1)[0] for p in paths}
            if patch.role == "fix":
                # the code, and on master the unit test it would break (left out on a tree without tests/)
                assert tops - {"tests"} == {"deepspeed"}, (series.name, patch.file)
            elif patch.role == "test":
                assert tops == {"tests"}, (series.name, patch.file)
            else:
                # v0.17.2-v0.17.5: the ALST test only (v0.17.2 has no tutorial; users read master's)
                expected = {"tests"} if series.name == "v0.17.2-v0.17.5" else {"tests", "docs"}
                assert tops == expected, (series.name, patch.file)
                assert "tests/unit/ulysses_alst/test_ulysses_sp_hf.py" in paths


def test_series_for_tree_reads_version_txt(manifest, tmp_path):
    (tmp_path / "version.txt").write_text("0.18.9\n")
    assert series_for_tree(tmp_path, manifest).name == "v0.18.4-v0.18.9"
    (tmp_path / "version.txt").unlink()
    with pytest.raises(errors.BadInput, match="no version.txt"):
        series_for_tree(tmp_path, manifest)


BLOCK = """
[[series]]
name = "{name}"
min_version = "{low}"
below_version = "{high}"
base_commit = "{commit}"
patches = [ {{ file = "0001-x.patch", role = "{role}" }} ]
"""


def write_manifest(path: Path, *blocks: str) -> Path:
    path.write_text("schema = 1\n" + "".join(blocks))
    return path


def block(name="a", low="0.1.0", high="0.2.0", commit="a" * 40, role="fix") -> str:
    return BLOCK.format(name=name, low=low, high=high, commit=commit, role=role)


def test_minimal_manifest_loads(tmp_path):
    manifest = load_manifest(write_manifest(tmp_path / "m.toml", block()))
    (series, ) = manifest.series
    assert series.version == 1 and series.directory == tmp_path / "a"
    assert series.cover_letter == tmp_path / "a" / "0000-cover-letter.patch"
    assert series_for_version("0.1.9", manifest) is series


@pytest.mark.parametrize(
    "blocks,message",
    [
        ((block(), block(name="b", low="0.1.5", high="0.3.0")), "overlap"),
        ((block(role="docs"), ), "role"),
        ((block(role="tests"), ), "fix\\|test\\|companion"),
        ((block(commit="abc"), ), "base_commit"),
        ((), "no \\[\\[series\\]\\]"),
    ],
)
def test_bad_manifests(tmp_path, blocks, message):
    with pytest.raises(errors.BadInput, match=message):
        load_manifest(write_manifest(tmp_path / "m.toml", *blocks))


def test_bad_schema_and_missing_file(tmp_path):
    (tmp_path / "m.toml").write_text("schema = 2\n")
    with pytest.raises(errors.BadInput, match="schema"):
        load_manifest(tmp_path / "m.toml")
    with pytest.raises(errors.BadInput, match="not found"):
        load_manifest(tmp_path / "absent.toml")
    (tmp_path / "bad.toml").write_text("schema = = 1\n")
    with pytest.raises(errors.BadInput, match="not valid TOML"):
        load_manifest(tmp_path / "bad.toml")


def test_master_fix_divides_before_the_reduce_scatter(manifest):
    """master from v4: sp folded into reduce_scatter_coalesced's pre-divide, the AutoEP mocks take it."""
    master = manifest.by_name("master")
    fix = master.fix_patches[0].path.read_text()
    assert "+    divisor: float = None," in fix and "divisor=averaging_world_size)" in fix
    assert "+    def test_divisor(self):" in fix
    test = master.patches[1].path.read_text()
    for text in (fix, test):
        assert "def fake_reduce_scatter(grads, process_group, divisor=None):" in text
    # the backports keep the one-line form: their releases have no averaging_world_size rescale to fold into
    for series in manifest.series:
        if series.name != "master":
            assert "divisor" not in series.fix_patches[0].path.read_text(), series.name


def test_version_sort_key_finds_the_version_in_a_name_or_none():
    from patch_and_test.series import version_sort_key

    assert version_sort_key("patch-and-test-ds0.19.8-gloo") == (0, 19, 8)
    assert version_sort_key("0.19.6+fe7b53c59") == (0, 19, 6)  # not (0, 19, 6, 7, 53, 59): the hash is no number
    assert version_sort_key("master") == ()
    assert sorted(["0.19.10", "0.19.8", "master"], key=version_sort_key) == ["master", "0.19.8", "0.19.10"]
