"""How the package's tests are laid out: markers declared by each module, pure logic under tests/unit/."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _module_marks(path: Path) -> set[str]:
    """The names in a module's ``pytestmark = pytest.mark.X`` (or a list of them)."""
    marks = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) \
                        and sub.value.attr == "mark":
                    marks.add(sub.attr)
    return marks


def test_every_multiprocess_module_declares_its_marker():
    """The marker comes from the module itself (pytestmark), not from a conftest matching paths."""
    modules = sorted((TESTS / "multiprocess").glob("test_*.py"))
    assert modules
    missing = [p.name for p in modules if "multiprocess" not in _module_marks(p)]
    assert not missing, missing


def test_no_conftest_marks_tests_by_path():
    for conftest in TESTS.rglob("conftest.py"):
        assert "item.fspath" not in conftest.read_text() and "item.path" not in conftest.read_text(), conftest
