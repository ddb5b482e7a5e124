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


BUILTIN_MARKS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}


def _pytest_options() -> dict:
    from repro.harness.files import load_toml

    return load_toml(TESTS.parent / "pyproject.toml")["tool"]["pytest"]["ini_options"]


def _marks_used() -> dict[str, list[str]]:
    """Every ``pytest.mark.X`` in the tests -> where."""
    used: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if "fixtures" in path.relative_to(TESTS).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "pytest"):
                used.setdefault(node.attr, []).append(f"{path.relative_to(TESTS)}:{node.lineno}")
    return used


def test_pytest_runs_strict():
    addopts = _pytest_options()["addopts"]
    assert {"--strict-markers", "--strict-config", "-ra"} <= set(addopts), addopts
    # The one pytest configuration: a pytest.ini, setup.cfg or tox.ini [pytest] would take precedence over it.
    root = TESTS.parent
    assert not (root / "pytest.ini").exists() and not (root / "setup.cfg").exists()
    assert "[pytest]" not in (root / "tox.ini").read_text()


def test_every_marker_used_is_registered():
    registered = {line.split(":", 1)[0].strip() for line in _pytest_options()["markers"]}
    used = _marks_used()
    assert {"multiprocess", "git_tools", "slow_tier"} <= set(used)  # the scan sees the markers in use
    unregistered = {name: where for name, where in used.items() if name not in registered | BUILTIN_MARKS}
    assert not unregistered, unregistered
