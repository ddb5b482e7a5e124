"""The jinja2 environment of the package's Markdown templates (``patch_and_test/templates/``): strict (an undefined
name is an error), no autoescaping, block tags on their own lines, so a template reads like the text it renders.
"""

from __future__ import annotations

import functools
import urllib.parse
from typing import Any

import jinja2

from patch_and_test.core.series import public_version
from repro.harness.report import Record as Model  # noqa: F401 (a context's record: typed, read-only, no unknown field)


def ratio(value: float | None) -> str:
    """A gradient ratio to four decimals; ``-`` where none was measured."""
    return "-" if value is None else f"{value:.4f}"


def span(value: Any) -> str:
    """A min-max span of ratios (``.lo``, ``.hi``): one number when they agree to four decimals."""
    if value is None:
        return "-"
    lo, hi = value.lo, value.hi
    return ratio(lo) if round(lo, 4) == round(hi, 4) else f"{ratio(lo)}-{ratio(hi)}"


def ulp(value: float | None) -> str:
    """An error in units in the last place, shortest form (``%g``); ``-`` where none was measured."""
    return "-" if value is None else f"{value:g}"


def counts(value: dict[str, int], empty: str = "none") -> str:
    """``{"passed": 4, "failed": 0}`` -> ``4 passed``; ``empty`` when every count is zero."""
    return ", ".join(f"{n} {k}" for k, n in value.items() if n) or empty


def link(path: str) -> str:
    """A bundle-relative path as a Markdown link target (a space, say, would end the link)."""
    return urllib.parse.quote(str(path))


@functools.lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    loader = jinja2.PackageLoader("patch_and_test", "templates")
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(ratio=ratio, span=span, ulp=ulp, counts=counts, rstrip=lambda text: str(text).rstrip(),
                       release=public_version)
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def replace_block(document: str, text: str, begin: str, end: str) -> str:
    """``document`` with what lies between its ``begin`` and ``end`` marker lines replaced by ``text``. Pure."""
    start, stop = _block(document, begin, end)
    return document[:start + len(begin)] + "\n" + text + "\n" + document[stop:]


def block_of(document: str, begin: str, end: str) -> str:
    """What lies between the marker lines, without the newlines around it."""
    start, stop = _block(document, begin, end)
    return document[start + len(begin):stop].strip("\n")


def _block(document: str, begin: str, end: str) -> tuple[int, int]:
    # A document without its markers is an error: rendering must never append a second copy of a block.
    start, stop = document.find(begin), document.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the document has no {begin.split(':')[0].lstrip('<!- ')} block (its marker lines)")
    return start, stop
