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
    from patch_and_test.review.pr import MAX_LINES, TITLE, local_links, nonblank_lines, render_pr

    b = _bundle(tmp_path)
    text = render_pr(b)
    assert text.startswith(f"# {TITLE}\n\n## Summary\n")
    assert nonblank_lines(text) <= MAX_LINES == 25, nonblank_lines(text)
    assert "\nFixes #8692\n" in text and "\n## Testing\n" in text and not local_links(text)
    assert "Release note:" in text and "@alanhuangyoo" in text
    # the compensators and the recipe that relied on the bug are named; no word on other pull requests or releases
    assert "transformers 5.25" in text and "hamishivi/tmax#9" in text and "transformers 5.0-5.24" in text
    assert "#8854" not in text and "not available to us" not in text and "supersedes" not in text
    # no backports, no bundle internals, no tool outside DeepSpeed, no build's local version
    assert "backport" not in text.lower() and "ZERO3_SP_GRADIENTS_SUMMED" not in text
    assert "zero3-sp-gradfix" not in text and "+unknown" not in text and ": fixed" not in text
    # Testing: the kept newest-upstream run, by its commit and pytest commands; what could not run here
    assert "`8cfb7779842a3deb300514716ada0e1b5d5b789e`" in text
    assert "`python -m pytest unit/v1/zero/test_zero.py::TestZero3SequenceParallelGradientScale`: without the " \
        "fix (this PR's test commit alone) 2 passed, 10 failed; with this PR 12 passed." in text
    assert "- Open, not run here (no GPU): GPU (the ALST test on CUDA), NCCL, multi-node qgZ." in text
    # the package's placeholder signs nothing: the squash message has no sign-off until a sender signs
    assert "Signed-off-by" not in text


def test_evidence_links_only_files_of_the_bundle_and_says_the_series_is_not_ready(tmp_path):
    from patch_and_test.review.pr import local_links, render_evidence

    b = _bundle(tmp_path)
    text = render_evidence(b)
    assert local_links(text)
    for target in local_links(text):
        assert (b / target.replace("%20", " ")).exists(), target
    assert "| `master` v6 |" in text and "**not ready to send**" in text and "zero3-sp signoff" in text
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

    from patch_and_test.review.pr import PrContext, load_context

    ctx = load_context(FIXTURES / "bundle")
    assert isinstance(ctx, PrContext)
    testing = ctx.body.testing
    assert testing.regression_with_fix["passed"] == 12 and testing.alst_failed_fix_alone == ["test_ulysses_sp_hf[3]"]
    assert ctx.body.signers == []  # the placeholder's
    assert ctx.fix is not None and ctx.fix.master.name == "master"
    assert ctx.matrix is not None and ctx.matrix.rows[0].values[0].before is not None
    assert [c.label for c in ctx.matrix.cells] == ["0.14.5 gloo"] and ctx.matrix.cells[0].verdict.outcome == "fixed"
    with pytest.raises(pydantic.ValidationError):
        ctx.body.signers = []  # frozen


def test_templates_are_strict():
    import jinja2
    import pytest

    from patch_and_test.core import templating

    env = templating.environment()
    assert env.undefined is jinja2.StrictUndefined and not env.autoescape and env.keep_trailing_newline
    with pytest.raises(jinja2.UndefinedError):
        templating.render("PR.md.j2", issue=1)  # no body
