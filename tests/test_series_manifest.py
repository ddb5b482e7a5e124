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
    "0.17.6": "v0.17.6-v0.18.3",
    "0.17.7": "v0.17.6-v0.18.3",  # tag v0.18.0's version.txt
    "0.18.3": "v0.17.6-v0.18.3",
    "0.18.4": "v0.18.4-v0.18.9",
    "0.18.9": "v0.18.4-v0.18.9",
    "0.19.0": "v0.19.0-v0.19.2",
    "0.19.2": "v0.19.0-v0.19.2",
    "0.19.3": "master",  # the averaging_world_size rescale exists from here
    "0.19.4": "master",
    "0.19.8": "master",
}
# The ALST test exists from 0.17.2, and no companion variant applies to 0.17.2-0.17.5.
NOT_COVERED = ("0.17.2", "0.17.3", "0.17.4", "0.17.5")
SERIES = ["v0.14.0-v0.17.1", "v0.17.6-v0.18.3", "v0.18.4-v0.18.9", "v0.19.0-v0.19.2", "master"]
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


@pytest.mark.parametrize("version", NOT_COVERED)
def test_the_documented_gap_is_refused_as_a_gap(manifest, version):
    with pytest.raises(errors.UnknownVersion, match="a gap between series") as caught:
        series_for_version(version, manifest)
    assert "v0.14.0-v0.17.1: >=0.14.0,<0.17.2" in str(caught.value)
    assert "0.17.2 to 0.17.5" in manifest.path.read_text()  # and the manifest says why


@pytest.mark.parametrize("text", ["", "master", "0.19", "abc.def.ghi"])
def test_unreadable_versions(manifest, text):
    with pytest.raises(errors.UnknownVersion):
        series_for_version(text, manifest)


def test_parse_version():
    assert parse_version("0.19.6+fe7b53c59") == (0, 19, 6)
    assert parse_version("v0.14.5") == (0, 14, 5)


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
    # Contiguous ranges but for the documented gap 0.17.2-0.17.5.
    for lower, upper in zip(manifest.series, manifest.series[1:]):
        gap = (lower.below_version, upper.min_version)
        assert lower.below_version == upper.min_version or gap == ((0, 17, 2), (0, 17, 6)), gap


def test_v2_series_carry_the_companion_and_the_downstream_notice(manifest):
    for name in WITH_COMPANION:
        series = manifest.by_name(name)
        assert series.version == 2
        (companion, ) = series.companion_patches
        assert companion.needs_tests and companion.needs_dirs == ("tests", "docs")
        letter = series.cover_letter.read_text()
        for text in ("Changes in v2:", "Range-diff against v1:", "Downstream notice", "TestUlyssesSPHF",
                     "202 / 256", "Who relies on today's ZeRO-3 behaviour", "What they should do"):
            assert text in letter, (name, text)
        assert "@GAO@" not in letter and "@TESTS@" not in letter and "***" not in letter
        range_diff = (series.directory / "range-diff-v1-v2.txt").read_text().splitlines()
        assert [line.split()[2] for line in range_diff] == ["=", "=", ">"], range_diff


def test_patches_touch_only_what_their_role_allows(manifest):
    for series in manifest.series:
        for patch in series.patches:
            paths = re.findall(r"^\+\+\+ b/(.+)$", patch.path.read_text(), re.M)
            assert paths, patch.file
            tops = {p.split("/", 1)[0] for p in paths}
            if patch.role == "fix":
                assert not tops & {"tests", "docs"}, (series.name, patch.file)
            elif patch.role == "test":
                assert tops == {"tests"}, (series.name, patch.file)
            else:
                assert tops == {"tests", "docs"}, (series.name, patch.file)
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
