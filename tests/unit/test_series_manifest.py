"""Manifest parsing and version -> series selection (fast, no git)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from patch_and_test.core import errors
from patch_and_test.core.series import load_manifest, parse_version, series_for_tree, series_for_version

EXPECTED = {
    "0.14.0": "v0.14.0-v0.16.1",
    "0.14.5": "v0.14.0-v0.16.1",
    "0.15.4": "v0.14.0-v0.16.1",
    "0.16.1": "v0.14.0-v0.16.1",
    "0.16.2": "v0.16.2-v0.17.1",  # ZeRO++ LoCo in the qgZ branch from here
    "0.16.9": "v0.16.2-v0.17.1",
    "0.17.1": "v0.16.2-v0.17.1",  # still tests/unit/runtime/zero/test_zero.py, no ALST test yet
    "0.17.2": "v0.17.2-v0.17.5",  # the ALST test from here; the tutorial from 0.17.3
    "0.17.5": "v0.17.2-v0.17.5",
    "0.17.6": "v0.17.6-v0.18.3",
    "0.17.7": "v0.17.6-v0.18.3",  # tag v0.18.0's version.txt
    "0.18.3": "v0.17.6-v0.18.3",
    "0.18.4": "v0.18.4-v0.18.9",
    "0.18.9": "v0.18.4-v0.18.9",
    "0.19.0": "v0.19.0-v0.19.2",
    "0.19.2": "v0.19.0-v0.19.2",
    "0.19.3": "v0.19.3-v0.19.7",  # the averaging_world_size rescale exists from here
    "0.19.4": "v0.19.3-v0.19.7",
    "0.19.6": "v0.19.3-v0.19.7",  # the mirror's master says 0.19.6
    "0.19.7": "v0.19.3-v0.19.7",
    "0.19.8": "v0.19.8",  # no LoCo branch in __avg_scatter_grads; a release, so a backport: with the marker
    "0.19.9": "master",  # a master checkout after 0.19.8 gets the pull request
    "0.20.2": "master",
}
SERIES = [
    "v0.14.0-v0.16.1", "v0.16.2-v0.17.1", "v0.17.2-v0.17.5", "v0.17.6-v0.18.3", "v0.18.4-v0.18.9", "v0.19.0-v0.19.2",
    "v0.19.3-v0.19.7", "v0.19.8", "master"
]
WITH_COMPANION = SERIES[2:]


@pytest.mark.parametrize("version,name", sorted(EXPECTED.items()))
def test_every_supported_version_has_its_series(manifest, version, name):
    assert series_for_version(version, manifest).name == name


@pytest.mark.parametrize("version", ["0.19.6", "0.19.6+fe7b53c59", "0.19.6.dev0", "v0.19.5", " 0.19.6\n"])
def test_the_mirrors_master_and_dev_versions_map_to_its_backport(manifest, version):
    # The mirror's master says 0.19.6 in version.txt while v0.19.5 is its newest tag.
    assert series_for_version(version, manifest).name == "v0.19.3-v0.19.7"


@pytest.mark.parametrize("version", ["0.13.5", "0.11.2", "0.21.0", "1.0.0"])
def test_unknown_versions_are_refused_with_the_supported_range(manifest, version):
    with pytest.raises(errors.UnknownVersion) as caught:
        series_for_version(version, manifest)
    message = str(caught.value)
    assert "\n" not in message
    assert version in message and ">=0.14.0,<0.21.0" in message
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


def roles_of(name: str) -> list[str]:
    """The pull request: fix, test, companion. A backport: the same, then the marker."""
    roles = ["fix", "test"] + (["companion"] if name in WITH_COMPANION else [])
    return roles if name == "master" else roles + ["marker"]


def test_manifest_shape(manifest):
    assert [s.name for s in manifest.series] == SERIES
    for series in manifest.series:
        assert series.version >= 1
        assert re.fullmatch(r"[0-9a-f]{40}", series.base_commit)
        roles = roles_of(series.name)
        assert [p.role for p in series.patches] == roles
        assert [p.file[:5] for p in series.patches] == [f"000{i}-" for i in range(1, len(roles) + 1)]
        assert [p.role for p in series.fix_patches] == [r for r in roles if r in ("fix", "marker")]
        assert any(p.role == "marker" for p in series.patches) == (series.name != "master")
        assert all(p.path.is_file() for p in series.patches)
        # The cover letter names the same base commit as the manifest.
        letter = series.cover_letter.read_text()
        assert f"base-commit: {series.base_commit}\n" in letter
        assert f"[PATCH v{series.version} 0/{len(roles)}]" in letter
    # Contiguous ranges: every release from 0.14.0 on has a series.
    for lower, upper in zip(manifest.series, manifest.series[1:]):
        assert lower.below_version == upper.min_version, (lower.name, upper.name)


MARKER = ("+# ZeRO-3 sums gradients over the sequence-parallel ranks on every reduction path (#8692). Client code\n"
          "+# that scales its sp loss for older releases can test this instead of comparing version numbers.\n"
          "+ZERO3_SP_GRADIENTS_SUMMED = True\n")
NEWEST_UPSTREAM = "8cfb7779842a3deb300514716ada0e1b5d5b789e"  # the 0.19.8 sdist on master edaa72212672


def test_the_pull_request_adds_no_module_constant_and_every_backport_carries_the_marker(manifest):
    master = manifest.by_name("master")
    for patch in master.patches:
        text = patch.path.read_text()
        assert "ZERO3_SP_GRADIENTS_SUMMED" not in text, patch.file
        # no module-level assignment at all (an added line "NAME = ..." at column 0)
        added = [line for line in text.split("\n---\n", 1)[1].splitlines() if re.match(r"^\+\w+\s*=", line)]
        assert not added, (patch.file, added)
    for series in manifest.series:
        if series.name == "master":
            continue
        (marker, ) = [p for p in series.patches if p.role == "marker"]
        text = marker.path.read_text()
        assert MARKER in text and re.findall(r"^\+\+\+ b/(.+)$", text, re.M) == ["deepspeed/runtime/zero/stage3.py"]
        assert "ZERO3_SP_GRADIENTS_SUMMED" not in series.fix_patches[0].path.read_text(), series.name
        assert series.patches[-1] is marker, "the marker comes after the pull request's patches"


def test_every_series_has_the_regression_test_in_both_layouts(manifest):
    for series in manifest.series:
        fix = series.fix_patches[0].path.read_text()
        assert "Reported-by: alanhuangyoo (GitHub)" in fix and "Fixes: ec029e7625ae" in fix
        test = series.patches[1].path.read_text()
        assert ("+    def test_sp2_dp1(self, reduce_scatter, contiguous_gradients, reduce_bucket_size, "
                "gradient_predivide_factor, dtype):") in test, series.name
        assert ("+    def test_sp2_dp2(self, reduce_scatter, contiguous_gradients, reduce_bucket_size, "
                "gradient_predivide_factor, dtype):") in test, series.name
        assert "+    @pytest.mark.world_size(4)" in test
        # master v6: the predivide and bf16 cases, and the qgZ branch through a mock; the expected value needs no
        # "consecutive ranks" premise (a backport's own mpu may still build its groups that way)
        for case in ('(False, False, 500, 8.0, "fp32"),', '(True, True, 500, 1.0, "bf16"),'):
            assert f"+        {case}" in test, (series.name, case)
        assert "+class TestZero3SequenceParallelQuantizedGradients:" in test, series.name
        assert "The sequence-parallel groups are consecutive ranks" not in test, series.name
        letter = series.cover_letter.read_text()
        assert f"Changes in v{series.version}:" in letter and f"Range-diff against v{series.version - 1}:" in letter
        assert "@TESTS@" not in letter and "@COMPANION@" not in letter and "***" not in letter
        if series.name in WITH_COMPANION:
            (companion, ) = series.companion_patches
            assert companion.needs_dirs == ("tests", "docs")


def test_the_pull_request_is_made_on_the_newest_upstream_tree(manifest):
    for name in ("master", "v0.19.8"):
        series = manifest.by_name(name)
        assert series.base_commit == NEWEST_UPSTREAM and series.base_ref == "newest-upstream"
    # The v0.19.8 backport is the pull request cherry-picked, plus the marker.
    pr, backport = manifest.by_name("master"), manifest.by_name("v0.19.8")
    for mine, theirs in zip(pr.patches, backport.patches):
        assert diff_of(mine.path) == diff_of(theirs.path), mine.file


def diff_of(path: Path) -> str:
    """The diff of a format-patch file, without its index line (blob ids differ only by the patches below)."""
    diff = path.read_text().split("\n---\n", 1)[1]
    diff = diff[diff.index("diff --git"):]
    return re.sub(r"^index \S+", "index", diff.rsplit("\n-- \n", 1)[0], flags=re.M)


def test_the_fix_touches_the_autoep_unit_test_only_where_autoep_exists(manifest):
    # That test builds the optimizer with object.__new__ (v0.19.3 on): the fix commit sets the attribute it
    # now reads and its reduce_scatter_coalesced mock takes the divisor.
    for series in manifest.series:
        fix = series.fix_patches[0].path.read_text()
        has_autoep = series.min_version >= (0, 19, 3)
        assert ("+++ b/tests/unit/v1/moe/test_autoep_unit.py" in fix) == has_autoep, series.name
        if has_autoep:
            assert "+        optimizer.sequence_parallel_size = 1" in fix
            assert "def fake_reduce_scatter(grads, process_group, divisor=None):" in fix
        # the AutoEP mock case of master v4's test patch is gone: it repeated the real test through a mock
        assert "test_zero3_reduce_scatter_grads_sum_over_sequence_parallel" not in series.patches[1].path.read_text()


def test_patches_touch_only_what_their_role_allows(manifest):
    for series in manifest.series:
        for patch in series.patches:
            paths = re.findall(r"^\+\+\+ b/(.+)$", patch.path.read_text(), re.M)
            assert paths, patch.file
            tops = {p.split("/", 1)[0] for p in paths}
            if patch.role == "fix":
                # the code, and the unit tests it would break or that cover its new argument (left out on a tree
                # without tests/)
                assert tops - {"tests"} == {"deepspeed"}, (series.name, patch.file)
            elif patch.role == "marker":
                assert paths == ["deepspeed/runtime/zero/stage3.py"], (series.name, patch.file)
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
        ((block(role="tests"), ), "fix\\|test\\|companion\\|marker"),
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


def test_every_fix_divides_before_the_reduce_scatter(manifest):
    """The pull request's form in every series: sp folded into reduce_scatter_coalesced's pre-divide (an optional
    divisor), the qgZ branch rescaled in that branch, nothing after the reduction."""
    for series in manifest.series:
        fix = series.fix_patches[0].path.read_text()
        assert "+    divisor: Optional[float] = None," in fix, series.name
        # master v6: the variable is the divisor, and the qgZ comment says only what the code does
        assert re.search(r"^\+ .*\bdivisor=divisor\)$", fix, re.M), series.name
        assert not re.search(r"^\+.*\baveraging_world_size\b", fix, re.M), series.name
        assert re.search(
            r"^\+            # all_to_all_quant_reduce (and all_to_all_loco_quant_reduce take|takes) no divisor: ",
            fix, re.M), series.name
        assert "+    world size, which makes the result the mean over the group. A single tensor whose size\n" in fix
        assert '+    @pytest.mark.parametrize("divisor", [1.0, 0.5])\n+    def test_divisor(self, divisor):' in fix
        assert "divided_by" not in fix and "divide once, before the reduction" not in fix, series.name


def test_version_sort_key_finds_the_version_in_a_name_or_none():
    from patch_and_test.core.series import version_sort_key

    assert version_sort_key("patch-and-test-ds0.19.8-gloo") == (0, 19, 8)
    assert version_sort_key("0.19.6+fe7b53c59") == (0, 19, 6)  # not (0, 19, 6, 7, 53, 59): the hash is no number
    assert version_sort_key("master") == ()
    assert sorted(["0.19.10", "0.19.8", "master"], key=version_sort_key) == ["master", "0.19.8", "0.19.10"]
