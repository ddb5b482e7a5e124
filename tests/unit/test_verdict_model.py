"""The pipeline's verdict as a pydantic model: written as before, validated when read back."""

from __future__ import annotations

import json

import pytest

from patch_and_test.core.checks import PytestCheck, ReproCheck
from patch_and_test.core.errors import Exit
from patch_and_test.downstream.clients import ClientWarning
from patch_and_test.job import verdict as verdict_mod
from patch_and_test.job.verdict import SCHEMA, Step, Verdict, decide, summary_table
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "bundle" / "results" / "patch-and-test-ds0.14.5-gloo"
KEPT = Verdict.load(FIXTURE / "verdict.json")  # a real run's source, series and inputs
KEPT_WARNING = ClientWarning(client="transformers", version="5.25.0", function="f", stage=3, expected=2.0,
                             deepspeed="DeepSpeed 0.19.8 (fixed)", message="m")
# The keys verdict.json had as a dataclass (dataclasses.asdict, then outcome and exit_code): kept.
KEYS = {
    "env", "source", "series", "deepspeed_before", "deepspeed_after", "backend", "steps", "before", "after", "tests",
    "suites", "already_fixed", "affected", "inputs", "environment", "wall_time_s", "client_warnings", "error",
    "error_exit", "schema", "outcome", "exit_code"
}


def _check(phase: str, expect: str, exit_code: int = 0) -> ReproCheck:
    return ReproCheck(name=f"{phase}/zero3_sp_grad_scale", script="zero3_sp_grad_scale", expect=expect,
                      exit_code=exit_code, pattern=expect, report=None, log="l", duration_s=1.0)


def _verdict(**changes) -> Verdict:
    twin = PytestCheck(name="twin", exit_code=0, outcomes={
        "t::a": "passed",
        "t::b": "passed"
    }, junit="twin.xml", log="twin.log", duration_s=2.0)
    fields = dict(
        env="patch-and-test-ds0.19.8-gloo", source=KEPT.source, series=KEPT.series, deepspeed_before="0.19.8",
        deepspeed_after="0.19.8+abc", backend="gloo", steps=[
            Step(name="source", status="ok", detail="pypi sdist", duration_s=1.5),
            Step(name="install patched", status="ok", detail="cached wheel")
        ], before=[_check("before", "buggy")], after=[_check("after", "fixed")], tests=[twin], suites=[],
        inputs=KEPT.inputs.model_copy(update={"code": "c0de"}))
    return Verdict(**{**fields, **changes})


def test_written_with_the_same_keys_and_read_back_equal(tmp_path):
    v = _verdict()
    v.write(tmp_path / "verdict.json")
    data = json.loads((tmp_path / "verdict.json").read_text())
    assert set(data) == KEYS
    assert data["schema"] == SCHEMA and data["outcome"] == "fixed" and data["exit_code"] == 0
    assert data["steps"][0] == {
        "name": "source",
        "status": "ok",
        "detail": "pypi sdist",
        "duration_s": 1.5,
        "log": None
    }
    back = Verdict.load(tmp_path / "verdict.json")
    assert back == v and back.to_dict() == data
    assert isinstance(back.before[0], ReproCheck) and back.before[0].holds
    assert summary_table(back) == summary_table(v)


def test_a_run_kept_from_before_the_model_still_loads():
    # Written by the dataclass version (a real 0.14.5 gloo run, trimmed: tests/fixtures/bundle), before the
    # graft and the host's transformers were recorded: those come back as null, every other key as it was.
    data = json.loads((FIXTURE / "verdict.json").read_text())
    v = KEPT
    assert (v.outcome, v.exit_code) == ("fixed", 0)
    assert v.source.graft is None and v.environment.transformers is None
    data["source"]["graft"] = data["environment"]["transformers"] = None
    assert v.to_dict() == data


def test_the_pipeline_fills_a_draft_and_decides_once_when_it_ends(monkeypatch):
    # As pipeline.run does: a draft (not validated), steps appended and fields assigned, then validated.
    fields = dict(_verdict(steps=[], before=[], after=[], tests=[], series=None))
    calls = []
    monkeypatch.setattr(verdict_mod, "decide", lambda v: calls.append(v) or decide(v))
    v = Verdict.model_construct(**{k: f for k, f in fields.items() if k != "schema_name"})  # as _Run makes it
    v.steps.append(Step(name="error", status="error", detail="boom"))
    v.error, v.error_exit = "boom", int(Exit.SERIES_DOES_NOT_APPLY)
    v.client_warnings = [KEPT_WARNING]
    assert calls == []
    done = Verdict.from_draft(v)
    assert done.error_exit is Exit.SERIES_DOES_NOT_APPLY
    assert (done.outcome, done.exit_code) == ("series-does-not-apply", int(Exit.SERIES_DOES_NOT_APPLY))
    done.to_dict(), done.to_dict()
    assert len(calls) == 1  # not once per computed field, nor per read
    assert Verdict.from_dict(done.to_dict()) == done


def test_its_records_are_typed():
    with pytest.raises(ValueError):
        Verdict.from_dict({**KEPT.to_dict(), "client_warnings": [{"message": "m"}]})  # a warning lacks its fields
    with pytest.raises(ValueError):
        Verdict.from_dict({**KEPT.to_dict(), "inputs": {**KEPT.inputs.model_dump(), "audit": "maybe"}})
    with pytest.raises(ValueError):
        Verdict.from_dict({**KEPT.to_dict(), "source": {**KEPT.source.model_dump(), "has_tests": "perhaps"}})


def test_a_step_takes_its_fields_by_name():
    with pytest.raises(TypeError):
        Step("a", "ok", "d")  # the positional form is gone
    with pytest.raises(ValueError):
        Step(name="a", status="fine", detail="d")  # not a status


@pytest.mark.parametrize("field,value,outcome", [
    ("before", [_check("before", "buggy", 1)], "bug-not-reproduced"),
    ("after", [_check("after", "fixed", 1)], "not-fixed"),
    ("after", [_check("after", "fixed", 77)], "skipped"),
    ("already_fixed", True, "already-fixed"),
])
def test_a_stored_outcome_its_checks_contradict_is_rejected(field, value, outcome):
    data = _verdict().to_dict()
    edited = {**data, field: _verdict(**{field: value}).to_dict()[field]}
    assert decide(Verdict.model_validate({
        k: v
        for k, v in edited.items() if k not in ("outcome", "exit_code")
    }))[0] == outcome
    with pytest.raises(ValueError, match="stored outcome='fixed'"):
        Verdict.from_dict(edited)


def test_a_stored_exit_code_alone_edited_is_rejected():
    with pytest.raises(ValueError, match="stored exit_code=1"):
        Verdict.from_dict({**_verdict().to_dict(), "exit_code": 1})


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(note="x"),  # an unknown key
        lambda d: d["before"][0].update(ok=True),  # in a check
        lambda d: d["steps"][0].update(status="fine"),
        lambda d: d["tests"][0].update(exit_code="zero"),
        lambda d: d.update(error_exit=42),  # not an exit code
        lambda d: d.pop("env"),
    ])
def test_a_file_that_does_not_validate_is_rejected(edit):
    data = json.loads(json.dumps(_verdict().to_dict()))
    edit(data)
    with pytest.raises(ValueError):
        Verdict.from_dict(data)


def test_another_schema_is_rejected():
    with pytest.raises(ValueError, match="not a zero3-sp-gradfix/verdict/v1 report"):
        Verdict.from_dict({**_verdict().to_dict(), "schema": "zero3-sp-gradfix/repro-report/v1"})
    with pytest.raises(ValueError, match="schema=None"):
        Verdict.from_dict({k: v for k, v in _verdict().to_dict().items() if k != "schema"})


def test_its_json_schema_names_every_outcome():
    schema = Verdict.json_schema()
    assert schema["$id"] == SCHEMA and schema["additionalProperties"] is False
    assert set(schema["properties"]) == KEYS
    assert "fixed" in schema["properties"]["outcome"]["enum"] and schema["properties"]["outcome"]["readOnly"]
