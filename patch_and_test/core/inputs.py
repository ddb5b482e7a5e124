"""Content hashes of what a pipeline run depends on: equal inputs, reusable results. The code part follows the
imports (function-level ones too) from the entry points, so a module added to that graph is covered at once.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import platform
from pathlib import Path

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.checks import ALST, AUDIT, REPRODUCERS
from repro.harness.env import dist_version
from repro.harness.report import Record

# Where the pipeline starts (the front door imports its commands by name), and the programs it runs as scripts (the
# reproducers, the audit, ALST, the twin).
ENTRY_POINTS = ("patch_and_test/__main__.py", "patch_and_test/job/cli.py", "patch_and_test/job/pipeline.py",
                *(f"repro/{script}.py"
                  for script in (*REPRODUCERS, AUDIT, ALST)), "tests/multiprocess/test_zero3_sp_gradient_scale.py")
# What they read that is not Python (and the conftests pytest loads around the twin).
DATA_GLOBS = ("repro/**/*.toml", "requirements/*.txt", "deepspeed-sdists.lock", "tests/conftest.py",
              "tests/multiprocess/conftest.py")
OWN_PACKAGES = ("repro", "patch_and_test", "tests")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_digest(paths: list[Path], root: Path) -> str:
    """One hash over (relative path, content hash) pairs, order-independent."""
    digest = hashlib.sha256()
    for path in sorted(set(paths), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def _imported(path: Path, root: Path) -> set[str]:
    """Names of the package's own modules that a file imports (relative imports resolved)."""
    package = ".".join(path.relative_to(root).parts[:-1])  # a module's package; for an __init__.py, its own
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)  # from pkg import module
    return {n for n in names if n.split(".")[0] in OWN_PACKAGES}


def pipeline_files(root: Path = PACKAGE_ROOT) -> list[Path]:
    """Every file of the package a pipeline run can execute or read, found from ENTRY_POINTS."""
    todo = [root / p for p in ENTRY_POINTS]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for name in _imported(path, root):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # the packages' __init__ run too
                base = root.joinpath(*parts[:i])
                todo += [f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()][:1]
    data = {p for g in DATA_GLOBS for p in root.glob(g) if p.is_file()}
    return sorted(seen | data)


def code_digest(root: Path = PACKAGE_ROOT) -> str:
    return tree_digest(pipeline_files(root), root)


class RunInputs(Record):
    """What a pipeline run's results depend on; a bundle reuses a cell only when this is equal."""

    code: str  # code_digest
    series: str  # tree_digest of the series folder's files
    source: str | None  # the sdist's sha256 or the upstream commit
    backend: str
    audit: bool
    python: str
    torch: str | None


def run_inputs(series_dir: Path, source: str | None, backend: str, audit: bool) -> RunInputs:
    series = tree_digest([p for p in series_dir.iterdir() if p.is_file()], series_dir)
    return RunInputs(code=code_digest(), series=series, source=source, backend=backend, audit=audit,
                     python=platform.python_version(), torch=dist_version("torch"))
