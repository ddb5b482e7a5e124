"""PR.md and EVIDENCE.md, rendered by ``patch_and_test/templates/`` from a bundle's own files only.

Deterministic (the same bundle renders the same bytes): that is how ``bundle verify`` checks every number.
"""

from __future__ import annotations

import re
from pathlib import Path

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core import templating
from patch_and_test.review.context import Body, PrContext, affected_context, affected_results, load_context

ISSUE = 8692
MAX_LINES = 25  # non-blank lines of PR.md: a squash commit's message, not a report
LINK = re.compile(r"\]\(([^)\s]+)\)")


def render_body(body: Body) -> str:
    """PR.md: the pull request's title and body, squash-ready (the bundle's and ``send``'s, one template)."""
    return templating.render("PR.md.j2", body=body, issue=ISSUE)


def render_pr(bundle: Path, ctx: PrContext | None = None) -> str:
    """The bundle's PR.md (from ``ctx``, the bundle's context when the caller has it)."""
    return render_body((ctx or load_context(bundle)).body)


def render_evidence(bundle: Path, ctx: PrContext | None = None) -> str:
    """The review's evidence: every table, with links to the bundle's files (where the bundle has them)."""

    def linked(text: str, target: str) -> str:  # a file a trimmed bundle lacks is named, not linked
        return f"[{text}]({templating.link(target)})" if (bundle / target).exists() else f"{text} (`{target}`)"

    return templating.render("EVIDENCE.md.j2", ctx=ctx or load_context(bundle), issue=ISSUE, linked=linked)


def render_sending(bundle: Path, ctx: PrContext | None = None) -> str:
    """SENDING.md: what the sender settles first (#8854, the release); it shows none of the results' numbers."""
    return templating.render("SENDING.md.j2", issue=ISSUE)


# The bundle's pages, each rendered from the bundle alone: bundle build writes them, bundle verify renders them again.
PAGES = {"PR.md": render_pr, "EVIDENCE.md": render_evidence, "SENDING.md": render_sending}


def write_pages(bundle: Path) -> None:
    ctx = load_context(bundle)  # one read of the results for every page
    for name, render in PAGES.items():
        (bundle / name).write_text(render(bundle, ctx))


def nonblank_lines(markdown: str) -> int:
    return sum(1 for line in markdown.splitlines() if line.strip())


def local_links(markdown: str) -> list[str]:
    """Link targets that are files (not web addresses, not anchors)."""
    return [t for t in LINK.findall(markdown) if not re.match(r"^(https?:|mailto:|#)", t)]


KEPT = PACKAGE_ROOT / "docs" / "affected-results"
BEGIN, END = "<!-- affected-results: begin (rendered by zero3-sp docs) -->", "<!-- affected-results: end -->"


def affected_table(root: Path = KEPT) -> str:
    """docs/affected-tests.md's table (between BEGIN and END): the runs kept under ``root``."""
    return templating.render("affected_table.md.j2", table=affected_context(affected_results(root)),
                             link_root="affected-results").rstrip("\n")
