"""The bundle's reuse key: computed from the pipeline's imports, and tied to Python and torch."""

from __future__ import annotations

import shutil
from pathlib import Path

from patch_and_test.review import bundle
from patch_and_test.core import inputs
from tests.unit.test_verdict_model import _verdict

ROOT = inputs.PACKAGE_ROOT


def _names(files: list[Path], root: Path = ROOT) -> set[str]:
    return {p.relative_to(root).as_posix() for p in files}


def test_the_module_list_is_what_the_pipeline_imports():
    names = _names(inputs.pipeline_files())
    # imported by the pipeline but missing from the old hand-written list / repro/*.py glob
    for needed in ("patch_and_test/upstream/suite.py", "patch_and_test/upstream/affected.py",
                   "patch_and_test/downstream/clients.py", "repro/harness/exit_codes.py", "repro/harness/launch.py",
                   "repro/audit/known_discrepancies.toml"):
        assert needed in names, needed
    # what only reads results, or never runs in a pipeline, does not invalidate them
    for not_needed in ("patch_and_test/review/bundle.py", "patch_and_test/review/pr.py",
                       "patch_and_test/tools/lint.py", "patch_and_test/tools/reroll.py",
                       "repro/downstream_clients.py"):
        assert not_needed not in names, not_needed


def test_digest_follows_an_imported_module_and_ignores_the_rest(tmp_path):
    for folder in ("repro", "patch_and_test", "tests", "requirements"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "fixtures"))
    shutil.copy(ROOT / "deepspeed-sdists.lock", tmp_path)
    before = inputs.code_digest(tmp_path)
    (tmp_path / "patch_and_test" / "pr.py").write_text("# a reader of results only\n")
    assert inputs.code_digest(tmp_path) == before
    exit_codes = tmp_path / "repro" / "harness" / "exit_codes.py"
    exit_codes.write_text(exit_codes.read_text() + "\n# changed\n")
    assert inputs.code_digest(tmp_path) != before


def test_results_of_another_torch_or_python_are_not_reused(tmp_path):
    key = inputs.run_inputs(ROOT / "patches" / "master", "sha", "gloo", True)
    assert key.python and key.torch
    verdict = tmp_path / "verdict.json"
    _verdict(inputs=key).write(verdict)
    assert bundle.reusable(verdict, key)
    for field, other in (("torch", "2.0.0+cpu"), ("python", "3.9.0")):
        _verdict(inputs=key.model_copy(update={field: other})).write(verdict)
        assert not bundle.reusable(verdict, key), field
