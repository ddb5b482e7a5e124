"""The pipeline's docstrings tell its steps in the order the code runs them (CONTRIBUTING.md: "Layout")."""

from __future__ import annotations

import re
from pathlib import Path

import patch_and_test
from patch_and_test.job import cli
from patch_and_test.job import pipeline

ROOT = Path(__file__).resolve().parents[2]
# The steps pipeline.py records, in the order the code runs them.
STEPS = ["source", "apply series", "install unpatched", "install patched"]


def _chain(line: str) -> list[str]:
    return [part.strip() for part in re.split(r"\s+->\s+", line.split(": ", 1)[-1].rstrip("."))]


def test_the_code_runs_the_steps_in_this_order():
    code = Path(pipeline.__file__).read_text()
    where = [code.index(f'r.step("{name}"') for name in STEPS]
    assert where == sorted(where)


def test_pipeline_docstring_names_the_steps_in_order():
    chain = _chain(pipeline.__doc__.splitlines()[0])
    assert [step for step in chain if step in STEPS] == STEPS, chain


def test_package_docstring_is_the_contributing_guides_chain():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    line = re.search(r"^get source\s+->.*$", text, re.M)
    assert line and _chain(patch_and_test.__doc__.splitlines()[0]) == _chain(line[0])


def test_cli_help_tells_the_series_goes_on_before_the_unpatched_install():
    text = " ".join(cli.__doc__.split())
    assert text.index("apply the series") < text.index("install the unpatched") < text.index("install the patched")
