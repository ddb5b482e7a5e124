"""patch_and_test/'s layout: role packages on floors, imports one way, the front door on top; and no module of
the tree reaches into another's private names.

Floors (a package's modules may import their own package and lower floors only):
1 ``core``; 2 ``upstream``, ``downstream``, ``tools``; 3 ``job``, ``doctor``; 4 ``review``; 5 ``cli``, the
``zero3-sp`` command (``__main__`` runs it as ``python -m patch_and_test``). ``repro`` is below all of them: it
imports nothing of ``patch_and_test``. Function-level imports count like the others.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "patch_and_test"
FLOORS = {"core": 1, "upstream": 2, "downstream": 2, "tools": 2, "job": 3, "doctor": 3, "review": 4}
TOP = 5


def _module(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _floor(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS):
        return FLOORS[parts[1]]
    if len(parts) == 2:
        return TOP + (parts[1] == "__main__")  # __main__ only runs the front door
    return 0  # the package itself (PACKAGE_ROOT) is no floor


def _internal(module: str) -> set[str]:
    """The patch_and_test modules ``module`` imports (a name imported from a module counts as that module)."""
    return {m for m in _imports(MODULES[module]) if m in MODULES and m != module and m != "patch_and_test"}


def test_the_role_packages_are_there_and_the_top_holds_only_the_front_door():
    assert set(FLOORS) <= {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(p.name for p in PKG.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py"]
    # One way in: a role module is a command through the front door's table, not through python -m.
    assert [p for p in PKG.rglob("*.py") if p.name == "__main__.py"] == [PKG / "__main__.py"]


def test_imports_go_down_the_floors_only():
    upward = []
    for module in MODULES:
        own = module.split(".")[:2]
        for target in _internal(module):
            if target.split(".")[:2] != own and _floor(target) >= _floor(module):
                upward.append(f"{module} (floor {_floor(module)}) imports {target} (floor {_floor(target)})")
    assert upward == []


def test_no_import_cycle_between_modules():
    done: set[str] = set()

    def visit(module: str, stack: tuple[str, ...]) -> None:
        assert module not in stack, " -> ".join(stack + (module, ))
        if module not in done:
            for target in _internal(module):
                visit(target, stack + (module, ))
            done.add(module)

    for module in MODULES:
        visit(module, ())


def test_repro_imports_nothing_of_patch_and_test():
    offenders = {
        _module(p): sorted(m for m in _imports(p) if m.startswith("patch_and_test"))
        for p in (ROOT / "repro").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _private_uses(path: Path) -> list[str]:
    """``from x import _y`` and ``x._y`` where x is another module of the tree."""
    tree = ast.parse(path.read_text())
    ours = ("repro", "patch_and_test")
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(ours):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            modules.update(a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in MODULES or (
                ROOT / "repro" / node.module.split(".", 1)[-1].replace(".", "/") / f"{a.name}.py").is_file())
        elif isinstance(node, ast.Import):
            modules.update((a.asname or a.name) for a in node.names if a.name.startswith(ours))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_name():
    # The package's own code; a unit test may reach into the module it tests.
    files = [p for d in ("repro", "patch_and_test", "benchmarks") for p in (ROOT / d).rglob("*.py")]
    offenders = {str(p.relative_to(ROOT)): names for p in files if (names := _private_uses(p))}
    assert offenders == {}
