"""The recording plugin and ``run_suite`` with real pytest on a synthetic DeepSpeed-like ``tests/`` folder."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from patch_and_test.upstream import suite as us

pytestmark = pytest.mark.git_tools

FILES = {
    "tests/pytest.ini":
    "[pytest]\n",
    "tests/unit/__init__.py":
    "",
    "tests/unit/common.py":
    "class DistributedExec:\n    world_size = 2\n",
    "tests/unit/test_a.py":
    textwrap.dedent("""\
        import time
        from unit.common import DistributedExec


        class TestRanks(DistributedExec):
            def test_r(self):
                pass


        class TestKeep(DistributedExec):
            def test_k(self):
                pass


        def test_ok():
            pass


        def test_fail():
            assert 1 == 2, "boom"
        """),
    "tests/unit/test_broken.py":
    "import not_a_module_for_this_test\n",
    "tests/unit/test_skipmod.py":
    "import pytest\npytest.skip('needs a GPU', allow_module_level=True)\n",
    "tests/unit/test_slow.py":
    "import time\n\n\ndef test_sleeps():\n    time.sleep(60)\n",
}
FILE_LIST = ["tests/unit/test_a.py", "tests/unit/test_broken.py", "tests/unit/test_skipmod.py"]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_quick_depth_records_outcomes_reasons_and_uncollectable_files(tree, tmp_path):
    run = us.run_suite("before", tree, FILE_LIST + ["tests/unit/test_added_later.py"], tmp_path / "out", depth="quick",
                       keep=("TestKeep", ), timeout=300)
    assert run.exit_code == 1 and not run.crashed
    assert run.outcomes == {
        "unit/test_a.py::TestKeep::test_k": "passed",
        "unit/test_a.py::test_ok": "passed",
        "unit/test_a.py::test_fail": "failed"
    }
    assert "boom" in run.messages["unit/test_a.py::test_fail"]
    assert run.deselected == 1  # TestRanks: starts ranks, left to the full depth
    assert run.ranks["unit/test_a.py::TestKeep::test_k"] and not run.ranks["unit/test_a.py::test_ok"]
    assert "ModuleNotFoundError" in run.not_collectable["unit/test_broken.py"]
    assert run.not_collectable["unit/test_skipmod.py"] == "skipped at collection: Skipped: needs a GPU"


def test_full_depth_keeps_the_rank_tests(tree, tmp_path):
    run = us.run_suite("full", tree, ["tests/unit/test_a.py"], tmp_path / "out", depth="full", timeout=300)
    assert run.outcomes["unit/test_a.py::TestRanks::test_r"] == "passed" and run.deselected == 0


def test_a_run_past_its_deadline_is_a_crash_and_the_comparison_an_error(tree, tmp_path):
    before = us.run_suite("before", tree, ["tests/unit/test_a.py"], tmp_path / "out", timeout=300)
    after = us.run_suite("after", tree, ["tests/unit/test_slow.py", "tests/unit/test_a.py"], tmp_path / "out",
                         timeout=8)
    assert after.timed_out and after.crashed
    c = us.compare("s", before, after)
    assert c.status == "error" and any("deadline" in e for e in c.errors)


def test_reruns_run_node_ids_and_tell_flaky_from_regression(tree, tmp_path):
    from tests.unit.test_upstream_suite import run
    tests = ["unit/test_a.py::test_ok", "unit/test_a.py::test_fail"]
    c = us.compare_after_reruns("s", tree, run("before", dict.fromkeys(tests, "passed")),
                                run("after", dict.fromkeys(tests, "failed")), tmp_path / "out", workers=0, times=2,
                                timeout=300)
    seen = {r.test: (r.reruns, r.category) for r in c.results}
    assert seen == {
        "unit/test_a.py::test_ok": (("passed", "passed"), "flaky"),
        "unit/test_a.py::test_fail": (("failed", "failed"), "regression")
    }


def test_xdist_workers_record_once_per_test(tree, tmp_path):
    # Without --forked: pytest-forked 1.7.5 under pytest 9.2 ends every test with "EXITED with status 3".
    pytest.importorskip("xdist")
    run = us.run_suite("xdist", tree, FILE_LIST, tmp_path / "out", depth="quick", keep=("TestKeep", ), timeout=300,
                       workers=2)
    assert run.workers == 2 and not run.crashed, Path(run.log).read_text()[-2000:]
    assert run.outcomes == {
        "unit/test_a.py::TestKeep::test_k": "passed",
        "unit/test_a.py::test_ok": "passed",
        "unit/test_a.py::test_fail": "failed"
    }
    assert "ModuleNotFoundError" in run.not_collectable["unit/test_broken.py"]
    assert run.deselected == 1  # each worker lists TestRanks: counted once


def test_pipeline_steps_select_run_and_classify(tmp_path):
    """The job's own steps on a synthetic tree: a series that breaks a test that names what it changes."""
    from patch_and_test.job import pipeline
    from patch_and_test.core.errors import Exit

    tree = tmp_path / "tree"
    for rel, text in {
            **FILES, "pkg/__init__.py":
            "",
            "pkg/stage.py":
            "class Optimizer3:\n\n    def __init__(self):\n"
            "        self.world = 2\n",
            "tests/unit/test_s.py":
            "from pkg.stage import Optimizer3\n\n\n"
            "def test_world():\n    assert Optimizer3().world == 2\n"
    }.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    series = tmp_path / "series"
    series.mkdir()
    (series / "0001-fix.patch").write_text(
        "diff --git a/pkg/stage.py b/pkg/stage.py\n--- a/pkg/stage.py\n"
        "+++ b/pkg/stage.py\n@@ -3,2 +3,2 @@ class Optimizer3:\n"
        "     def __init__(self):\n-        self.world = 2\n+        self.world = 3\n")
    (tmp_path / "results").mkdir()  # pipeline.run makes it
    r = pipeline._Run(pipeline.PipelineConfig(env_name="t", results=tmp_path / "results"))
    selection = pipeline._affected_selection(r, tree, series)
    assert selection.paths == ["tests/unit/test_s.py"]
    before = pipeline._affected_run(r, tree, selection, "before")
    stage = tree / "pkg" / "stage.py"
    # The series' change as a fast machine makes it: same size, same mtime (the before run's .pyc of
    # stage.py must not be taken for the new code; CI once saw 'ok' here).
    st = stage.stat()
    stage.write_text(stage.read_text().replace("= 2", "= 3"))
    os.utime(stage, ns=(st.st_atime_ns, st.st_mtime_ns))
    pipeline._affected_compare(r, tree, selection, before)
    (suite, ) = r.verdict.suites
    assert suite.status == "regression" and suite.regressions == ["unit/test_s.py::test_world"]
    assert r.verdict.affected == selection and (tmp_path / "results" / "affected-tests.txt").is_file()
    assert [s.name for s in r.verdict.steps
            ][-2:] == ["after: rerun passed-before/failed-after tests", "after: upstream affected tests before/after"]
    # With the reproducers' checks holding, the job's outcome is the regression.
    from patch_and_test.job.verdict import decide
    from tests.unit.test_upstream_suite import verdict_with
    assert decide(verdict_with(suite)) == ("regression", Exit.REGRESSION)
