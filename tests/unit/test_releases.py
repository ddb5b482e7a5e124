"""The releases table's pure parts: the row verdict, the report's derived fields, the Markdown, what docs checks."""

from __future__ import annotations

import json

import pytest

from patch_and_test.core import errors
from patch_and_test.tools import releases
from patch_and_test.core import source
from patch_and_test.core.series import SkippedPatch
from patch_and_test.tools.releases import (ReleaseRow, ReleasesReport, SeriesPatch, SeriesUsed, render_markdown,
                                           row_problem, select_versions)

FIX = "0001-Scale-ZeRO-3-__avg_scatter_grads-by-sequence_para.patch"
MARK = "0002-Mark-it.patch"
TEST = "0003-Test-it.patch"
SERIES = SeriesUsed(
    name="s",
    version=2,
    range=">=0.19.0,<0.20.0",
    patches=[
        SeriesPatch(file=FIX, role="fix", needs=[], sha256="a" * 64),
        SeriesPatch(file=MARK, role="marker", needs=[], sha256="b" * 64),  # a role with no folder: goes on an sdist
        SeriesPatch(file=TEST, role="test", needs=["tests"], sha256="c" * 64)
    ])


def _row(version="0.19.7", **changes) -> ReleaseRow:
    fields = dict(version=version, sdist=f"deepspeed-{version}.tar.gz", sha256="d" * 64, downloaded=True, locked=False,
                  version_txt=version, mirror_tag=False, series="s", applied=[FIX, MARK],
                  left_out=[SkippedPatch(file=TEST, reason="needs tests/")], fixed_before=False, fixed_after=True,
                  error=None, seconds=1.0)
    return ReleaseRow(**{**fields, **changes})


def _report(rows, listed=None, series=(SERIES, )) -> ReleasesReport:
    listed = listed if listed is not None else [r.version for r in rows]
    return ReleasesReport(command="zero3-sp releases", listed_by="--version", version_from=None, version_to=None,
                          listed=listed, mirror_newest_tag="v0.19.5", series=list(series), rows=rows,
                          python_version="3.11.7", git_version="2.39.5", pip_version="23.2.1",
                          started_at="2026-01-01T00:00:00+00:00", wall_time_s=3.0)


def test_a_row_holds_when_the_sdist_patches_went_on_and_the_tree_turned_fixed():
    assert SERIES.sdist_patches == [FIX, MARK]
    assert row_problem(_row(), SERIES) is None


@pytest.mark.parametrize("changes,problem", [
    (dict(series=None), "no series in patches/series.toml covers this version"),
    (dict(fixed_before=True), "already fixed"),
    (dict(error="series s v2: 0001 does not apply (error: patch failed: stage3.py:10)", applied=[],
          fixed_after=False), "does not apply: series s v2: 0001 does not apply (error: patch failed"),
    (dict(applied=[FIX]), f"the series' patches that need no tests/ or docs/ are {FIX}, {MARK}"),
    (dict(applied=[FIX, MARK, TEST]), "applied " + ", ".join([FIX, MARK, TEST])),
    (dict(fixed_after=False), "tree_has_fix says unfixed after the series"),
])
def test_a_row_fails_on_each_wrong_fact(changes, problem):
    assert problem in row_problem(_row(**changes), SERIES)


def test_a_row_naming_a_series_the_report_lacks_fails():
    assert "not among the report's series" in row_problem(_row(series="other"), None)


def test_the_report_derives_failures_holds_and_exit_code():
    good = _report([_row("0.19.6"), _row("0.19.7")])
    assert good.holds and good.exit_code == 0 and good.failures == {} and good.held == 2
    assert good.untagged == ["0.19.6", "0.19.7"]
    bad = _report([_row("0.19.6"), _row("0.19.7", fixed_after=False)], listed=["0.19.6", "0.19.7", "0.19.8"])
    assert not bad.holds and bad.exit_code == 1 and bad.held == 1
    assert bad.failures == {"0.19.8": "listed but not checked", "0.19.7": "tree_has_fix says unfixed after the series"}
    assert "2 release(s) checked, 1 hold; FAIL: 0.19.8: listed but not checked" in bad.summary()
    assert not _report([]).holds


def test_a_stored_verdict_its_rows_contradict_is_refused():
    data = _report([_row(fixed_after=False)]).to_dict()
    assert data["holds"] is False and data["exit_code"] == 1
    ReleasesReport.from_dict(data)
    with pytest.raises(ValueError, match="stored holds=True"):
        ReleasesReport.from_dict({**data, "holds": True})
    with pytest.raises(ValueError, match="stored failures"):
        ReleasesReport.from_dict({**data, "failures": {}})


def test_the_markdown_is_rendered_from_the_report():
    report = _report(
        [_row("0.19.5", mirror_tag=True, locked=True),
         _row("0.19.7", fixed_after=False, error="a | b", applied=[])])
    text = render_markdown(report, "releases/releases.json")
    assert "rendered by zero3-sp docs from releases/releases.json, which zero3-sp releases writes" in text
    assert "**2 release(s), 1 hold, 1 FAIL.**" in text
    assert "source of **0.19.7** (bold below)" in text and "newest release tag is v0.19.5" in text
    assert (f"| 0.19.5 | v0.19.5 | `{'d' * 16}` | s v2 | 0001 fix, 0002 marker | unfixed | fixed | holds "
            "| sha256 pinned in deepspeed-sdists.lock |") in text
    # A failing row says why; a | in git's message does not split the cell.
    assert ("| **0.19.7** | **none** | `dddddddddddddddd` | s v2 | none | unfixed | **unfixed** | **FAILS** "
            "| does not apply: a \\| b; no git tag: PyPI is its only source |") in text
    assert f"`{TEST}` (test, needs tests/: not on an sdist; sha256 `{'c' * 16}`)" in text
    assert "also has each sdist's full sha256" in text and "d" * 17 not in text
    assert "in 3 s\n(2 of 2 sdists downloaded by that run" in text


def test_without_a_mirror_the_tag_is_unknown():
    report = _report([_row(mirror_tag=None)]).model_copy(update={"mirror_newest_tag": None})
    text = render_markdown(report, "r.json")
    assert "No DeepSpeed mirror was there" in text and "| 0.19.7 | ? |" in text and report.untagged == []


def test_select_versions_is_inclusive_oldest_first_and_skips_what_is_not_a_release():
    listed = source.parse_index_versions(
        "deepspeed (0.19.8)\nAvailable versions: 0.19.8, 0.19.7, 0.14.0, 0.13.5, 0.3.16, 1.0\n  INSTALLED: 0.19.8\n")
    assert listed == ["0.19.8", "0.19.7", "0.14.0", "0.13.5", "0.3.16", "1.0"]
    assert select_versions(listed, "0.14.0", "0.19.7") == ["0.14.0", "0.19.7"]
    with pytest.raises(errors.BadInput, match="no 'Available versions:' line"):
        source.parse_index_versions("ERROR: No matching distribution found for deepspeed\n")


def test_the_default_range_is_the_manifests_lowest_to_the_newest_covered_release(manifest):
    assert releases.default_range(manifest, ["0.21.1", "0.19.8", "0.13.5"]) == ("0.14.0", "0.19.8")
    with pytest.raises(errors.BadInput, match="no DeepSpeed release that patches/series.toml covers"):
        releases.default_range(manifest, ["0.13.5"])


def _write(tmp_path, report):
    path, md = tmp_path / "releases" / "releases.json", tmp_path / "releases.md"
    report.write(path)
    md.write_text(render_markdown(report, "releases/releases.json"))
    return path, md


def test_docs_renders_the_kept_markdown_and_finds_changed_patches_and_failing_rows(tmp_path, manifest):
    real = releases.series_used(manifest.by_name("v0.19.8"))
    row = _row("0.19.8", series="v0.19.8", applied=[p.file for p in real.patches if not p.needs])
    path, md = _write(tmp_path, _report([row], series=[real]))
    assert releases.problems(manifest, path) == [] and releases.kept_markdown(md, path) == md.read_text()
    changed = real.model_copy(
        update={"patches": [real.patches[0].model_copy(update={"sha256": "0" * 64}), *real.patches[1:]]})
    path, md = _write(tmp_path, _report([row.model_copy(update={"fixed_after": False})], series=[changed]))
    assert releases.problems(manifest, path) == [
        f"series v0.19.8 v{real.version}: patches/ differ from what the table applied (rerun zero3-sp releases)",
        "0.19.8: tree_has_fix says unfixed after the series"
    ]
    path.write_text(json.dumps({**json.loads(path.read_text()), "holds": True}))
    with pytest.raises(ValueError, match="stored holds=True"):  # zero3-sp docs: exit 2, the artifact named
        releases.kept_markdown(md, path)


@pytest.mark.parametrize("argv", [["--from", "0.19"], ["--version", "0.19.8", "--to", "0.19.8"], ["--version", "x"]])
def test_bad_input_exits_2_before_anything_is_downloaded(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        releases.main(argv)
    assert exited.value.code == 2 and "error:" in capsys.readouterr().err


def test_the_committed_table_holds_and_is_for_the_series_in_patches(manifest):
    """docs/releases.md is docs/releases/releases.json rendered, every row holds, and the series it applied
    are the ones in patches/ now: after a series changes, rerun `zero3-sp releases`."""
    assert releases.problems(manifest) == []
    assert releases.kept_markdown(releases.DEFAULT_MARKDOWN) == releases.DEFAULT_MARKDOWN.read_text()
