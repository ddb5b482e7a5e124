"""PR.md assembly: an included document's headings nest under the PR's own sections."""

from patch_and_test.pr_context import demote_headings
from tests.conftest import FIXTURES


def test_headings_go_one_level_down_but_code_blocks_stay():
    doc = "## What changes\ntext\n```bash\n# a shell comment\n```\n### Detail\n#hashtag"
    assert demote_headings(doc).splitlines() == [
        "### What changes", "text", "```bash", "# a shell comment", "```", "#### Detail", "#hashtag"]


def _bundle(tmp_path):
    """A bundle of the package's real patches and kept results, and one real cell (the bundle-cell fixture)."""
    import shutil

    from patch_and_test import bundle as bundle_mod, downstream_table

    b = tmp_path / "bundle"
    shutil.copytree(bundle_mod.PACKAGE_ROOT / "patches", b / "patches")
    downstream_table.gather(tmp_path / "none", b / "results" / "downstream")
    shutil.copytree(bundle_mod.KEPT_AFFECTED, b / "results" / "affected")
    (b / "downstream-notice.md").write_text("# notice\n")
    cell = FIXTURES / "bundle-cell" / "results" / "patch-and-test-ds0.19.8-gloo"
    shutil.copytree(cell, b / "results" / cell.name)
    return b


def test_pr_is_one_screen_then_folded_and_squash_ready(tmp_path):
    from patch_and_test.pr import FOLD, MAX_HEAD_LINES, head_lines, render_pr

    text = render_pr(_bundle(tmp_path))
    assert text.startswith("# Scale ZeRO-3 __avg_scatter_grads by sequence_parallel_size\n\nFixes #8692\n")
    assert head_lines(text) <= MAX_HEAD_LINES, head_lines(text)
    head = text.split(FOLD)[0]
    for section in ("## Problem", "## The fix", "## Behaviour change", "## How it was tested", "## Credits"):
        assert section in head
    assert "@alanhuangyoo" in head and "@Eliaaazzz" in head and "0.20.2" in head
    assert "* twin TestZero3SequenceParallelGradientScale, with the series: 0.19.8 gloo: 4 passed." in head
    # The downstream count comes from the kept reports: every measured gradient matched the rule.
    from patch_and_test.downstream_table import KEPT_RESULTS, reports

    n = sum(r.status == "measured" for _, _, rep in reports(KEPT_RESULTS) for r in rep.rows)
    assert n >= 16 and f"{n} of {n} measured gradients as the rule in the notice predicts" in head
    assert text.rstrip().endswith("</details>") and text.count(FOLD) == 1
    # The kept affected-tests runs: one summary line on the screen, the table behind the fold.
    assert "DeepSpeed's own tests the series can reach (quick tier; master 0.19.6, " in head
    assert ", 0 regressions (table below)." in head
    assert "| master 0.19.6 (`" in text.split(FOLD)[1]


def test_the_context_is_typed_and_read_only():

    import pydantic
    import pytest

    from patch_and_test.pr_context import PrContext, load_context

    ctx = load_context(FIXTURES / "bundle")
    assert isinstance(ctx, PrContext)
    assert ctx.how_tested.ran == ["0.14.5 gloo"] and ctx.how_tested.outcomes == ["fixed"]
    assert (ctx.how_tested.downstream_held, ctx.how_tested.downstream_measured) == (16, 16)
    assert ctx.fix is not None and ctx.fix.master.name == "master" and ctx.fix.backports == 6
    assert ctx.matrix is not None and ctx.matrix.rows[0].values[0].before is not None
    with pytest.raises(pydantic.ValidationError):
        ctx.how_tested.ran = []  # frozen


def test_templates_are_strict():
    import jinja2
    import pytest

    from patch_and_test import templating

    env = templating.environment()
    assert env.undefined is jinja2.StrictUndefined and not env.autoescape and env.keep_trailing_newline
    with pytest.raises(jinja2.UndefinedError):
        templating.render("PR.md.j2", title="t", issue=1, fold="f")  # no ctx
