"""docs/schemas/: the JSON schema of every report model, regenerated with the models, and the
committed reports valid under them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from patch_and_test.review import docs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loaded():
    models, skipped = docs.load_models()
    for why in skipped.values():
        warnings.warn(f"schema not checked, its model does not import: {why}")
    return models, skipped


def test_docs_schemas_is_up_to_date(loaded):
    models, skipped = loaded
    assert skipped == {} and set(models) == set(docs.MODELS)
    files = docs.rendered(ROOT / "docs" / "schemas")
    assert [p for p, text in files.items() if text is None or not docs.same(p.read_text(), text)] == [], \
        "a report model changed: run `zero3-sp docs` and commit docs/schemas/"


def test_every_listed_model_names_its_own_schema(loaded):
    models, _ = loaded
    ids = [m.SCHEMA for m in models.values()]
    assert len(set(ids)) == len(ids)
    for name, model in models.items():
        assert model.SCHEMA.startswith("zero3-sp-gradfix/") and name in model.SCHEMA, (name, model.SCHEMA)
        data = json.loads(docs.render_schema(model))
        assert data["$id"] == model.SCHEMA and data["type"] == "object"


def test_rendered_files_and_the_orphans_to_remove(tmp_path, capsys):
    verdict = {"verdict": docs.MODELS["verdict"]}
    (tmp_path / "gone.schema.json").write_text("{}\n")
    files = docs.rendered(tmp_path, verdict)
    assert files.keys() == {tmp_path / "verdict.schema.json", tmp_path / "gone.schema.json"}
    assert files[tmp_path / "gone.schema.json"] is None  # a name no longer listed
    text = files[tmp_path / "verdict.schema.json"]
    assert text.endswith("}\n") and text.startswith('{\n  "$comment": "written by zero3-sp docs')  # pretty, sorted
    assert not docs.same(text.replace('"env"', '"environ"'), text)
    # A model listed but not importable: its file is left alone, neither rendered nor removed.
    assert docs.rendered(tmp_path, {
        **verdict, "gone": "repro.no_such_module.Report"
    }).keys() == {tmp_path / "verdict.schema.json"}
    assert "warning: skipped repro.no_such_module.Report" in capsys.readouterr().err


def test_a_model_that_does_not_import_is_skipped_with_the_reason():
    models, skipped = docs.load_models({
        "verdict": "patch_and_test.job.verdict.Verdict",
        "nowhere": "repro.no_such_module.Report",
        "not-a-model": "patch_and_test.job.verdict.Step"
    })
    assert list(models) == ["verdict"]
    assert "ModuleNotFoundError" in skipped["nowhere"] and "not a report model" in skipped["not-a-model"]


# tests/fixtures/bundle is verified whole by test_bundle_verify.py.
FOLDERS = ["docs", "benchmarks/results", "tests/fixtures/bundle-cell"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_committed_reports_are_valid(folder, loaded):
    # A bundle carries the kept runs (docs/, benchmarks/results/); the fixtures are bundles trimmed
    # from real runs: bundle verify validates each report in them.
    from patch_and_test.review.bundle import validate_reports

    problems, _ = validate_reports(ROOT / folder)
    assert problems == []


def test_another_pydantic_wording_is_not_a_changed_model(loaded):
    models, _ = loaded
    text = docs.render_schema(models["verdict"])
    data = json.loads(text)
    data["$comment"] = "written by zero3-sp docs with pydantic 2.99.0"
    data["title"] = "Verdict, as a newer pydantic words it"
    assert docs.same(json.dumps(data), text)
    data["properties"]["environment"] = data["properties"].pop("env")
    assert not docs.same(json.dumps(data), text)
    # the same pydantic writes the same text: any other text is a changed model
    assert not docs.same(text.replace("Verdict", "Verdict ", 1), text)
