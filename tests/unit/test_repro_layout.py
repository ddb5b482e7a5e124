"""repro/'s layout: runnable scripts on top of one harness and family packages, each with its program and report."""

from __future__ import annotations

from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parents[2] / "repro"
FAMILIES = ("gradscale", "audit", "alst", "downstream", "training")
ROLES = ("report", "run")  # hollow roles are merged into these


def test_the_top_of_repro_holds_only_runnable_scripts():
    for path in sorted(REPRO.iterdir()):
        if path.name.startswith((".", "__pycache__")) or path.is_dir():
            continue
        if path.name == "__init__.py":
            continue
        text = path.read_text()
        assert path.suffix == ".py" and 'if __name__ == "__main__":' in text, f"{path.name} is not a runnable script"
        assert len(text.splitlines()) < 80, f"{path.name}: a script stays thin; its logic belongs in a package"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_a_program_and_a_report(family):
    present = {p.stem for p in (REPRO / family).glob("*.py")}
    assert set(ROLES) <= present, f"repro/{family} lacks {sorted(set(ROLES) - present)}"
