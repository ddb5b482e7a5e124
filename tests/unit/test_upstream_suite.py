"""Classifying DeepSpeed's tests before and after a series: pure logic on synthetic runs and records."""

from __future__ import annotations

import json

import pytest

from patch_and_test.upstream import suite as us
from patch_and_test.core.errors import Exit


def run(name: str, outcomes: dict[str, str], *, exit_code: int | None = None, timed_out: bool = False,
        messages: dict[str, str] | None = None, broken: dict[str, str] | None = None) -> us.SuiteRun:
    if exit_code is None:
        exit_code = 1 if any(o in ("failed", "error") for o in outcomes.values()) else 0
    return us.SuiteRun(name=name, depth="quick", files=["tests/unit/test_a.py"], exit_code=exit_code,
                       timed_out=timed_out, wall_s=12.0, outcomes=outcomes, messages=messages or {},
                       not_collectable=broken or {}, ranks={t: False
                                                            for t in outcomes}, deselected=3, log=f"{name}.log",
                       record=f"{name}.jsonl")


def categories(c: us.SuiteComparison) -> dict[str, str]:
    return {r.test: r.category for r in c.results}


def test_every_category():
    before = run("before", {
        "a": "passed",
        "b": "failed",
        "c": "passed",
        "d": "failed",
        "e": "passed",
        "f": "skipped",
        "g": "passed"
    }, messages={"b": "E1 before"})
    after = run(
        "after", {
            "a": "passed",
            "b": "failed",
            "c": "failed",
            "d": "passed",
            "e": "error",
            "f": "skipped",
            "g": "failed",
            "n": "passed",
            "m": "failed"
        }, messages={
            "b": "AssertionError: x",
            "c": "AttributeError: no sequence_parallel_size",
            "m": "boom"
        })
    c = us.compare("s", before, after, reruns={
        "c": ["failed", "failed"],
        "e": ["error", "error"],
        "g": ["failed", "passed"]
    })
    assert categories(c) == {
        "a": "passed",
        "b": "pre-existing",
        "c": "regression",
        "d": "fixed",
        "e": "regression",
        "f": "skipped",
        "g": "flaky",
        "n": "new",
        "m": "new-failed"
    }
    assert c.status == "regression" and c.errors == []
    assert c.regressions == ["c", "e", "m"] and c.flaky == ["g"] and c.fixed == ["d"] and c.pre_existing == ["b"]
    reasons = {r.test: r.reason for r in c.results}
    assert reasons["b"] == "AssertionError: x" and reasons["c"].startswith("AttributeError")
    assert {r.test: r.reruns for r in c.results}["g"] == ("failed", "passed")
    assert any("regression: c: AttributeError" in line for line in c.describe())


def test_no_regressions_is_ok():
    c = us.compare("s", run("before", {"a": "passed", "b": "failed"}), run("after", {"a": "passed", "b": "failed"}))
    assert c.status == "ok" and c.pre_existing == ["b"] and c.collected_before == c.collected_after == 2


@pytest.mark.parametrize("after_kwargs,why", [
    (dict(outcomes={}, exit_code=2), "pytest exit 2"),
    (dict(outcomes={"a": "passed"}, exit_code=2, timed_out=True), "deadline"),
    (dict(outcomes={}, exit_code=5), "no tests collected"),
    (dict(outcomes={"a": "passed"}), "fewer tests after"),
    (dict(outcomes={"a": "passed"}, exit_code=3), "pytest exit 3"),
])
def test_a_broken_after_run_is_an_error_never_no_regressions(after_kwargs, why):
    before = run("before", {"a": "passed", "b": "passed"})
    c = us.compare("s", before, run("after", **after_kwargs))
    assert c.status == "error" and any(why in e for e in c.errors), c.errors


def test_a_crashed_before_run_is_an_error_too():
    c = us.compare("s", run("before", {"a": "passed"}, exit_code=2, timed_out=True), run("after", {"a": "passed"}))
    assert c.status == "error"


def test_same_count_but_a_test_missing_is_an_error():
    c = us.compare("s", run("before", {"a": "passed"}), run("after", {"renamed": "passed"}))
    assert c.status == "error" and categories(c) == {"a": "missing", "renamed": "new"}


def test_not_collectable_files_are_listed_and_a_newly_broken_file_is_an_error():
    broken = {"unit/test_hf.py": "ModuleNotFoundError: No module named 'transformers'"}
    c = us.compare("s", run("before", {"a": "passed"}, broken=broken), run("after", {"a": "passed"}, broken=broken))
    assert c.status == "ok" and c.not_collectable == broken
    c = us.compare("s", run("before", {"a": "passed"}), run("after", {"a": "passed"}, broken=broken))
    assert c.status == "error" and "cannot be collected after" in c.errors[0]


def test_rerun_candidates():
    assert us.rerun_candidates(run("b", {
        "a": "passed",
        "b": "failed",
        "c": "passed"
    }), run("a", {
        "a": "failed",
        "b": "failed",
        "c": "passed"
    })) == ["a"]


def test_read_record_merges_phases_and_survives_a_cut_line(tmp_path):

    def report(nodeid, when, outcome, longrepr=None, ranks=False):
        return {
            "$report_type": "TestReport",
            "nodeid": nodeid,
            "when": when,
            "outcome": outcome,
            "longrepr": longrepr,
            "user_properties": [["ranks", ranks]]
        }

    lines = [
        {
            "$report_type": "SessionStart",
            "pytest_version": "9"
        },
        {
            "$report_type": "CollectReport",
            "nodeid": "unit/test_hf.py",
            "outcome": "failed",
            "longrepr": "ImportError while importing\nE   ModuleNotFoundError: No module named 'x'"
        },
        {
            "$report_type": "CollectReport",
            "nodeid": "unit/test_gpu.py",
            "outcome": "skipped",
            "longrepr": ["unit/test_gpu.py", 2, "needs a GPU"]
        },
        {
            "$report_type": "CollectReport",
            "nodeid": "unit/t.py",
            "outcome": "passed",
            "longrepr": None
        },
        report("unit/t.py::T::a", "setup", "passed", ranks=True),
        report("unit/t.py::T::a", "call", "failed", {"reprcrash": {
            "message": "E: x"
        }}, ranks=True),
        report("unit/t.py::b", "setup", "passed"),
        report("unit/t.py::b", "call", "passed"),
        report("unit/t.py::b", "teardown", "failed", {"reprcrash": {
            "message": "E: td"
        }}),
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"$report_type": "Tes')
    (tmp_path / "r.deselected").write_text("unit/t.py::T::c\nunit/t.py::T::c\n")  # two xdist workers
    outcomes, messages, broken, ranks, deselected = us.read_record(path)
    assert outcomes == {"unit/t.py::T::a": "failed", "unit/t.py::b": "error"}
    assert messages == {"unit/t.py::T::a": "E: x", "unit/t.py::b": "E: td"}
    assert broken == {
        "unit/test_hf.py": "ModuleNotFoundError: No module named 'x'",
        "unit/test_gpu.py": "skipped at collection: needs a GPU"
    }
    assert ranks == {"unit/t.py::T::a": True, "unit/t.py::b": False} and deselected == 1


def test_regression_has_its_own_exit_code():
    assert int(Exit.REGRESSION) == 6


def verdict_with(suite: us.SuiteComparison | None, *, bug_seen: bool = True):
    from patch_and_test.core.checks import ReproCheck
    from patch_and_test.job.verdict import Verdict

    def check(phase: str, holds: bool) -> ReproCheck:
        return ReproCheck(name=f"{phase}/zero3_sp_grad_scale", script="zero3_sp_grad_scale", expect="x",
                          exit_code=0 if holds else 1, pattern="fixed", report=None, log="log", duration_s=1.0)

    return Verdict(env="e", source=None, series=None, deepspeed_before="0.19.6", deepspeed_after="0.19.6",
                   backend="gloo", steps=[], before=[check("before", bug_seen)], after=[check("after", True)],
                   tests=[], suites=[suite] if suite else [])


@pytest.mark.parametrize(
    "before,after,reruns,outcome",
    [
        ({
            "a": "passed"
        }, {
            "a": "passed"
        }, {}, ("fixed", Exit.OK)),
        ({
            "a": "passed"
        }, {
            "a": "failed"
        }, {
            "a": ["failed", "failed"]
        }, ("regression", Exit.REGRESSION)),
        ({
            "a": "passed"
        }, {
            "a": "failed"
        }, {
            "a": ["passed", "failed"]
        }, ("fixed", Exit.OK)),  # flaky: reported only
        ({
            "a": "failed"
        }, {
            "a": "failed"
        }, {}, ("fixed", Exit.OK)),  # pre-existing: reported only
        ({
            "a": "passed",
            "b": "passed"
        }, {
            "a": "passed"
        }, {}, ("error", Exit.ERROR)),  # fewer after
    ])
def test_the_verdict_outcome_follows_the_suite(before, after, reruns, outcome):
    from patch_and_test.job.verdict import decide, summary_table

    v = verdict_with(us.compare("upstream affected tests", run("before", before), run("after", after), reruns))
    assert decide(v) == outcome
    text = summary_table(v)
    assert "upstream affected tests [quick]" in text and f"outcome: {outcome[0]}" in text
    assert v.to_dict()["suites"][0]["status"] in ("ok", "regression", "error")


def test_bug_not_reproduced_still_comes_before_a_regression():
    from patch_and_test.job.verdict import decide

    suite = us.compare("s", run("before", {"a": "passed"}), run("after", {"a": "failed"}), {"a": ["failed"] * 2})
    assert decide(verdict_with(suite, bug_seen=False))[1] == Exit.BUG_NOT_REPRODUCED


def test_a_before_run_the_tier_emptied_is_not_a_crash():
    # v0.16.9's quick depth: every selected test starts ranks, and the regression test is new.
    empty = run("before", {}, exit_code=5).model_copy(update={"deselected": 214})
    after = run("after", {"t::new": "passed"})
    c = us.compare("s", empty, after)
    assert c.status == "ok" and categories(c) == {"t::new": "new"}
    # Nothing collected at all (no depth deselected anything): still an error.
    nothing = empty.model_copy(update={"deselected": 0})
    assert us.compare("s", nothing, after).status == "error"
    # An after run the depth emptied records no test: an error whatever the before run did.
    assert us.compare("s", empty, empty.model_copy(update={"name": "after"})).status == "error"
