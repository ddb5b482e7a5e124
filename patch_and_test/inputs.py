"""Content hashes of what a pipeline run depends on: equal hashes, reusable results."""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# The code whose behaviour a verdict reflects: the reproducers, the pipeline, the twin test. Not
# what only reads verdicts (bundle.py, pr.py) or never runs in a pipeline (lint, reroll, selftest).
PIPELINE_MODULES = ("__init__", "__main__", "checks", "errors", "inputs", "install", "pipeline", "series", "source",
                    "verdict")
CODE_GLOBS = ("repro/*.py", "repro/*.toml", *(f"patch_and_test/{m}.py" for m in PIPELINE_MODULES),
              "tests/multiprocess/test_zero3_sp_gradient_scale.py", "tests/multiprocess/conftest.py",
              "tests/conftest.py", "requirements/*.txt", "deepspeed-sdists.lock")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_digest(paths: list[Path], root: Path) -> str:
    """One hash over (relative path, content hash) pairs, order-independent."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def code_digest(root: Path = PACKAGE_ROOT) -> str:
    return tree_digest([p for g in CODE_GLOBS for p in root.glob(g) if p.is_file()], root)


def series_digest(series_dir: Path) -> str:
    return tree_digest([p for p in series_dir.iterdir() if p.is_file()], series_dir)
