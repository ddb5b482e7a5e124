"""PR.md: the pull-request description, rendered only from a bundle's own files.

Deterministic: the same bundle renders the same bytes, which is how ``bundle verify`` checks
that every number in PR.md is the one in the results it cites. Nothing here is typed by
hand that a run produced: ratios, counts, versions and environments are read from the
verdicts and reports under ``<bundle>/results/`` into a typed context
(``patch_and_test.pr_context.load_context``) and rendered by the templates
``patch_and_test/templates/PR.md.j2`` and ``templates/pr/*.md.j2``; each table cites the files
it read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patch_and_test import templating
from patch_and_test.pr_context import affected_context, affected_results, load_context

TITLE = "Scale ZeRO-3 __avg_scatter_grads by sequence_parallel_size"
ISSUE = 8692
# The description a reviewer reads on one screen ends here; the rest is folded.
FOLD = "<details><summary>Evidence: root cause, series, matrix, DeepSpeed's tests, ALST, audit, numerics, " \
    "environment</summary>"
MAX_HEAD_LINES = 60

__all__ = ["FOLD", "ISSUE", "MAX_HEAD_LINES", "TITLE", "affected_results", "affected_table", "head_lines",
           "render_pr"]


def render_pr(bundle: Path) -> str:
    """A squash-ready GitHub pull-request description: one screen, then the evidence folded."""
    return templating.render("PR.md.j2", ctx=load_context(bundle), title=TITLE, issue=ISSUE, fold=FOLD)


def head_lines(markdown: str) -> int:
    """How many lines PR.md shows before its first fold."""
    return markdown.split(FOLD, 1)[0].rstrip("\n").count("\n") + 1


def affected_table(found: list[tuple[str, dict[str, Any]]], link_root: str) -> str:
    """Per tree: the selection's tests before and after the series, and the pre-existing failures' reasons."""
    return templating.render("affected_table.md.j2", table=affected_context(found), link_root=link_root).rstrip("\n")
