"""``zero3-sp releases`` on real PyPI sdists (network): rows that hold, and one that must fail.

The sdists are downloaded once into the package cache ($ZERO3_SP_CACHE or ~/.cache/zero3-sp-gradfix).
"""

from __future__ import annotations

import pytest

from patch_and_test.tools import releases
from patch_and_test.core import source
from patch_and_test.tools.releases import ReleasesReport
from repro.harness.env import cache_root

pytestmark = [pytest.mark.network, pytest.mark.slow_tier]

FIX = "0001-Scale-ZeRO-3-__avg_scatter_grads-by-sequence_para.patch"


def test_the_oldest_and_a_release_without_a_tag_take_their_series(tmp_path, manifest):
    path, md = tmp_path / "releases" / "releases.json", tmp_path / "releases.md"
    assert releases.main(["--version", "0.19.7", "--version", "0.14.0", "--json",
                          str(path), "--markdown",
                          str(md)]) == 0
    report = ReleasesReport.load(path)
    assert [r.version for r in report.rows] == ["0.14.0", "0.19.7"] and report.holds
    for row in report.rows:
        series = manifest.by_name(row.series)
        assert row.applied == [p.file for p in series.fix_patches] and FIX in row.applied
        assert [x.file for x in row.left_out] == [p.file for p in series.test_patches]
        assert not row.fixed_before and row.fixed_after and len(row.sha256) == 64
    if source.mirror_path().exists():
        assert report.untagged == ["0.19.7"] and "**0.19.7** | **none** |" in md.read_text()
    assert releases.problems(manifest, path) == [] and md.read_text() == releases.kept_markdown(md, path)


def test_a_series_that_does_not_apply_fails_its_row_with_gits_error(tmp_path):
    """0.19.8 given the 0.14-0.16 backport: git am refuses, the row fails, the run exits 1."""
    backport = (releases.PACKAGE_ROOT / "patches" / "v0.14.0-v0.16.1").as_posix()
    manifest = tmp_path / "series.toml"
    manifest.write_text(f"""schema = 1
[[series]]
name = "wrong"
min_version = "0.19.8"
below_version = "0.20.0"
base_commit = "{'0' * 40}"
directory = "{backport}"
patches = [{{ file = "{FIX}", role = "fix" }}]
""")
    path, md = tmp_path / "r.json", tmp_path / "r.md"
    assert releases.main(
        ["--version", "0.19.8", "--manifest",
         str(manifest), "--json",
         str(path), "--markdown",
         str(md)]) == 1
    row, = ReleasesReport.load(path).rows
    assert row.applied == [] and not row.fixed_before and not row.fixed_after
    assert f"{FIX} does not apply to the sdist repo (error: " in row.error
    assert str(cache_root()) not in row.error and "FAILS" in md.read_text()
