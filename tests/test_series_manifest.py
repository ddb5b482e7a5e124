"""Manifest parsing and version -> series selection (fast, no git)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from patch_and_test import errors
from patch_and_test.series import load_manifest, parse_version, series_for_tree, series_for_version

EXPECTED = {
    "0.14.0": "v0.14.0-v0.17.5",
    "0.14.5": "v0.14.0-v0.17.5",
    "0.15.4": "v0.14.0-v0.17.5",
    "0.16.9": "v0.14.0-v0.17.5",
    "0.17.5": "v0.14.0-v0.17.5",  # still tests/unit/runtime/zero/test_zero.py
    "0.17.6": "v0.17.6-v0.19.2",
    "0.18.9": "v0.17.6-v0.19.2",
    "0.19.2": "v0.17.6-v0.19.2",
    "0.19.3": "master",  # the averaging_world_size rescale exists from here
    "0.19.4": "master",
    "0.19.8": "master",
}


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


@pytest.mark.parametrize("text", ["", "master", "0.19", "abc.def.ghi"])
def test_unreadable_versions(manifest, text):
    with pytest.raises(errors.UnknownVersion):
        series_for_version(text, manifest)


def test_parse_version():
    assert parse_version("0.19.6+fe7b53c59") == (0, 19, 6)
    assert parse_version("v0.14.5") == (0, 14, 5)


def test_manifest_shape(manifest):
    assert [s.name for s in manifest.series] == ["v0.14.0-v0.17.5", "v0.17.6-v0.19.2", "master"]
    for series in manifest.series:
        assert series.version >= 1
        assert re.fullmatch(r"[0-9a-f]{40}", series.base_commit)
        assert [p.role for p in series.patches] == ["fix", "test"]
        assert series.fix_patches[0].file.startswith("0001-") and series.test_patches[0].file.startswith("0002-")
        assert all(p.path.is_file() for p in series.patches)
        # The cover letter names the same real upstream commit as the manifest.
        assert f"base-commit: {series.base_commit}\n" in series.cover_letter.read_text()
    # Contiguous ranges: every version from the lowest to the highest has exactly one series.
    for lower, upper in zip(manifest.series, manifest.series[1:]):
        assert lower.below_version == upper.min_version


def test_test_patches_touch_only_tests(manifest):
    for series in manifest.series:
        for patch in series.patches:
            paths = re.findall(r"^\+\+\+ b/(.+)$", patch.path.read_text(), re.M)
            assert paths and all(p.startswith("tests/") == patch.needs_tests for p in paths), patch.file


def test_series_for_tree_reads_version_txt(manifest, tmp_path):
    (tmp_path / "version.txt").write_text("0.18.9\n")
    assert series_for_tree(tmp_path, manifest).name == "v0.17.6-v0.19.2"
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
