"""PR.md in DeepSpeed's squash-merge form, EVIDENCE.md with the rest; both from a bundle's own files."""

import re
import shutil

from tests.conftest import FIXTURES


def _bundle(tmp_path):
    """A bundle of the package's real patches and kept results, and one real cell (the bundle-cell fixture)."""
    from patch_and_test.review import bundle as bundle_mod
    from patch_and_test.downstream import table as downstream_table

    b = tmp_path / "bundle"
    shutil.copytree(bundle_mod.PACKAGE_ROOT / "patches", b / "patches")
    downstream_table.gather(tmp_path / "none", b / "results" / "downstream")
    shutil.copytree(bundle_mod.KEPT_AFFECTED, b / "results" / "affected")
    shutil.copytree(bundle_mod.COMMITTED_BENCHMARKS, b / "results" / "benchmarks")
    (b / "downstream-notice.md").write_text("# notice\n")
    cell = FIXTURES / "bundle-cell" / "results" / "patch-and-test-ds0.19.8-gloo"
    shutil.copytree(cell, b / "results" / cell.name)
    return b


def test_pr_is_a_squash_message_of_at_most_25_lines_that_links_nothing_in_the_bundle(tmp_path):
    from patch_and_test.review.pr import MAX_LINES, local_links, nonblank_lines, render_pr

    b = _bundle(tmp_path)
    text = render_pr(b)
    title = re.search(r"^Subject: \[PATCH [^\]]*\] (.*(?:\n .*)*)",
                      next((b / "patches" / "master").glob("0001-*")).read_text(), re.M)[1]
    assert text.startswith(f"# {' '.join(title.split())}\n\n## Summary\n")
    assert nonblank_lines(text) <= MAX_LINES == 25, nonblank_lines(text)
    assert "\nFixes #8692\n" in text and "\n## Testing\n" in text and not local_links(text)
    assert "Release note:" in text and "#8854" in text and "@alanhuangyoo" in text
    # no backports, no bundle internals; the sign-off is the series' (the placeholder here)
    assert "backport" not in text.lower() and "ZERO3_SP_GRADIENTS_SUMMED" not in text
    assert text.rstrip().endswith("Signed-off-by: Your Name <you@example.invalid>")
    assert "DeepSpeed 0.19.8+unknown: fixed" in text


def test_evidence_links_only_files_of_the_bundle_and_says_the_series_is_not_ready(tmp_path):
    from patch_and_test.review.pr import local_links, render_evidence

    b = _bundle(tmp_path)
    text = render_evidence(b)
    assert local_links(text)
    for target in local_links(text):
        assert (b / target.replace("%20", " ")).exists(), target
    assert "| `master` v5 |" in text and "**not ready to send**" in text and "zero3-sp signoff" in text
    assert "DeepSpeed's own tests on real checkouts" not in text  # hand-placed logs are gone with their section


def test_the_one_cell_bundle_renders_no_empty_table():
    from patch_and_test.review.pr import render_evidence

    text = render_evidence(FIXTURES / "bundle-cell")
    assert "This bundle carries no `patches/`." in text
    for table in re.findall(r"(?m)^(\|.*\|\n\|[-| ]+\|\n)(?!\|)", text):
        raise AssertionError(f"a table with no rows: {table!r}")


def test_the_context_is_typed_and_read_only():
    import pydantic
    import pytest

    from patch_and_test.review.context import PrContext, load_context

    ctx = load_context(FIXTURES / "bundle")
    assert isinstance(ctx, PrContext)
    assert [c.label for c in ctx.testing.cells] == ["0.14.5 gloo"] and ctx.testing.cells[0].verdict.outcome == "fixed"
    assert ctx.fix is not None and ctx.fix.master.name == "master"
    assert ctx.matrix is not None and ctx.matrix.rows[0].values[0].before is not None
    with pytest.raises(pydantic.ValidationError):
        ctx.testing.cells = []  # frozen


def test_templates_are_strict():
    import jinja2
    import pytest

    from patch_and_test.core import templating

    env = templating.environment()
    assert env.undefined is jinja2.StrictUndefined and not env.autoescape and env.keep_trailing_newline
    with pytest.raises(jinja2.UndefinedError):
        templating.render("PR.md.j2", issue=1)  # no ctx
