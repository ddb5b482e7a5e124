"""repro/'s layout: runnable scripts on top of one harness and family packages with the same roles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parents[2] / "repro"
FAMILIES = ("gradscale", "audit", "alst", "downstream", "training")
ROLES = ("space", "measure", "expect", "report", "run")


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
def test_every_family_has_the_same_roles(family):
    present = {p.stem for p in (REPRO / family).glob("*.py")}
    assert set(ROLES) <= present, f"repro/{family} lacks {sorted(set(ROLES) - present)}"


def _imported_private_names(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("repro"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_module_imports_another_modules_private_name():
    # The package's code; a unit test may reach into the module it tests.
    root = REPRO.parent
    files = [p for d in ("repro", "patch_and_test", "benchmarks") for p in (root / d).rglob("*.py")]
    offenders = {str(p.relative_to(root)): names for p in files if (names := _imported_private_names(p))}
    assert offenders == {}
