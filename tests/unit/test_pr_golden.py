"""PR.md and the downstream notice, rendered from fixed bundles, byte for byte as the golden files.

The fixtures are trimmed copies of real runs (provenance: ``tests/fixtures/*/PROVENANCE.md``):

* ``tests/fixtures/bundle/``: a ``patch-and-test`` bundle of DeepSpeed 0.14.5 (gloo) with the
  kept affected-tests and downstream-clients runs and the reduce-path benchmark;
* ``tests/fixtures/bundle-cell/``: one whole ``patch-and-test`` cell of DeepSpeed 0.19.8 (gloo)
  with the parity audit and the ALST recipe, before and after: the sections the first bundle has no
  results for, and a bundle without ``patches/`` (no empty table).

``render_pr`` reads only the bundle's own files (its ``patches/``, ``results/`` and
``downstream-notice.md``), nothing of the package's ``patches/`` or ``docs/``. What else the
golden files depend on is the package's code: the templates (``patch_and_test/templates/``: the
prose between the numbers), ``patch_and_test.review.pr`` and the report models it validates
with (``repro.gradscale.report``, ``repro.alst.report``, ``repro.downstream.report``). A change to
the wording is a change to the golden files: rerun with ``UPDATE_GOLDEN=1`` and review the diff.
The golden files were first written by the f-string renderer the templates replaced; PR.md's were
rewritten when it took DeepSpeed's squash-merge form, with EVIDENCE.md's beside them.
Needs jinja2 and pydantic, not DeepSpeed or torch.
"""

from __future__ import annotations

import difflib
import os

import pytest
from tests.conftest import FIXTURES


def _render_pr(name: str) -> str:
    from patch_and_test.review.pr import render_pr

    return render_pr(FIXTURES / name)


def _render_evidence(name: str) -> str:
    from patch_and_test.review.pr import render_evidence

    return render_evidence(FIXTURES / name)


def _render_notice(name: str) -> str:
    from patch_and_test.downstream.table import render_into

    bundle = FIXTURES / name
    return render_into((bundle / "downstream-notice.md").read_text(), bundle)


CASES = {
    "bundle.PR.md.golden": lambda: _render_pr("bundle"),
    "bundle-cell.PR.md.golden": lambda: _render_pr("bundle-cell"),
    "bundle.EVIDENCE.md.golden": lambda: _render_evidence("bundle"),
    "bundle-cell.EVIDENCE.md.golden": lambda: _render_evidence("bundle-cell"),
    "bundle.downstream-notice.md.golden": lambda: _render_notice("bundle"),
}


@pytest.mark.parametrize("golden", sorted(CASES))
def test_rendered_as_the_golden_file(golden):
    path = FIXTURES / golden
    rendered = CASES[golden]().encode()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_bytes(rendered)
    expected = path.read_bytes()
    if rendered != expected:
        diff = "".join(
            difflib.unified_diff(expected.decode().splitlines(keepends=True),
                                 rendered.decode().splitlines(keepends=True), fromfile=f"{golden} (golden)",
                                 tofile="rendered now", n=2))
        pytest.fail(f"{golden}: the rendering differs from the golden file "
                    f"(UPDATE_GOLDEN=1 rewrites it):\n{diff or '(only line endings or a final newline differ)'}")


@pytest.mark.parametrize("golden", sorted(CASES))
def test_no_golden_guesses_about_other_pull_requests_or_shows_a_build_s_local_version(golden):
    """The review's blockers: no speculation about #8854, no ``0.19.8+unknown`` (a version nobody can install)."""
    text = (FIXTURES / golden).read_text()
    for banned in ("not available to us", "supersedes", "+unknown"):
        assert banned not in text, f"{golden} says {banned!r}"
