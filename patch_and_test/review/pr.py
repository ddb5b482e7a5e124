"""PR.md and EVIDENCE.md, rendered only from a bundle's own files.

DeepSpeed squash-merges: the pull request's title and body become the commit. ``PR.md`` is that body in
the form maintainers merge (title, Summary, ``Fixes #N``, Testing; at most ``MAX_LINES`` non-blank lines,
no link into the bundle, which GitHub would not resolve); ``EVIDENCE.md`` is the rest of the review:
root cause, series, matrix, DeepSpeed's tests, ALST, audit, numerics, environment, each table citing the
bundle's file it read. Deterministic: the same bundle renders the same bytes, which is how ``bundle
verify`` checks that every number is the one in the results. Nothing here is typed by hand that a run
produced: the context is read from the verdicts and reports under ``<bundle>/results/``
(``patch_and_test.review.context.load_context``) and rendered by ``patch_and_test/templates/``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core import templating
from patch_and_test.review.context import PrContext, affected_context, affected_results, load_context

ISSUE = 8692
MAX_LINES = 25  # non-blank lines of PR.md: a squash commit's message, not a report
LINK = re.compile(r"\]\(([^)\s]+)\)")

__all__ = [
    "ISSUE", "MAX_LINES", "affected_results", "affected_table", "local_links", "nonblank_lines", "render_evidence",
    "render_pr"
]


def render_pr(bundle: Path, ctx: PrContext | None = None) -> str:
    """The pull request's body, squash-ready (from ``ctx``, the bundle's context when the caller has it)."""
    return templating.render("PR.md.j2", ctx=ctx or load_context(bundle), issue=ISSUE)


def render_evidence(bundle: Path, ctx: PrContext | None = None) -> str:
    """The review's evidence: every table, with links to the bundle's files (where the bundle has them)."""

    def linked(text: str, target: str) -> str:
        # A trimmed bundle may lack a file a run wrote (a log, a junit file): named, not linked.
        return f"[{text}]({templating.link(target)})" if (bundle / target).exists() else f"{text} (`{target}`)"

    return templating.render("EVIDENCE.md.j2", ctx=ctx or load_context(bundle), issue=ISSUE, linked=linked)


def nonblank_lines(markdown: str) -> int:
    return sum(1 for line in markdown.splitlines() if line.strip())


def local_links(markdown: str) -> list[str]:
    """Link targets that are files (not web addresses, not anchors)."""
    return [t for t in LINK.findall(markdown) if not re.match(r"^(https?:|mailto:|#)", t)]


def affected_table(found: list[tuple[str, dict[str, Any]]], link_root: str) -> str:
    """Per tree: the selection's tests before and after the series, and the pre-existing failures' reasons."""
    return templating.render("affected_table.md.j2", table=affected_context(found), link_root=link_root).rstrip("\n")


KEPT = PACKAGE_ROOT / "docs" / "affected-results"
DOC = PACKAGE_ROOT / "docs" / "affected-tests.md"
BEGIN, END = "<!-- affected-results: begin (rendered by python -m patch_and_test.affected_job --table) -->", \
    "<!-- affected-results: end -->"


def render_doc(document: str, root: Path = KEPT) -> str:
    """``document`` with the block between BEGIN and END replaced by the table of the runs under ``root``."""
    head, _, rest = document.partition(BEGIN)
    _, _, tail = rest.partition(END)
    table = affected_table(affected_results(root), "affected-results")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def write_affected_doc() -> int:
    """Re-render the kept runs' table into docs/affected-tests.md (after copying a run into docs/affected-results)."""
    DOC.write_text(render_doc(DOC.read_text()))
    print(f"{DOC}: table of {len(list(KEPT.glob('*/affected.json')))} kept runs")
    return 0
