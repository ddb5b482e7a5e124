"""docs/schemas/: the JSON schema of every report model, regenerated with the models, and the
committed reports valid under them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from patch_and_test.review import schemas

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loaded():
    models, skipped = schemas.load_models()
    for why in skipped.values():
        warnings.warn(f"schema not checked, its model does not import: {why}")
    return models, skipped


def test_docs_schemas_is_up_to_date(loaded):
    models, skipped = loaded
    assert skipped == {} and set(models) == set(schemas.MODELS)
    assert schemas.stale(schemas.SCHEMAS_DIR, models, skipped) == [], \
        "a report model changed: run `python -m patch_and_test.schemas` and commit docs/schemas/"


def test_every_listed_model_names_its_own_schema(loaded):
    models, _ = loaded
    ids = [m.SCHEMA for m in models.values()]
    assert len(set(ids)) == len(ids)
    for name, model in models.items():
        assert model.SCHEMA.startswith("zero3-sp-gradfix/") and name in model.SCHEMA, (name, model.SCHEMA)
        data = json.loads(schemas.render(model))
        assert data["$id"] == model.SCHEMA and data["type"] == "object"


def test_write_then_check(tmp_path, loaded):
    models, _ = loaded
    verdict = {"verdict": models["verdict"]}
    assert schemas.write(tmp_path, verdict) == [tmp_path / "verdict.schema.json"]
    text = (tmp_path / "verdict.schema.json").read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "$comment": "written by')  # pretty, keys sorted
    assert schemas.stale(tmp_path, verdict) == [] and schemas.write(tmp_path, verdict) == []
    (tmp_path / "verdict.schema.json").write_text(text.replace('"env"', '"environ"'))
    (tmp_path / "gone.schema.json").write_text("{}\n")
    assert schemas.stale(tmp_path, verdict) == [
        f"{tmp_path / 'verdict.schema.json'}: differs from patch_and_test.job.verdict.Verdict",
        f"{tmp_path / 'gone.schema.json'}: no model in patch_and_test.review.schemas.MODELS"
    ]
    # A model listed but not importable: its file is left alone, neither checked nor removed.
    assert schemas.stale(tmp_path, verdict, {"gone": "x"}) == [
        f"{tmp_path / 'verdict.schema.json'}: differs from patch_and_test.job.verdict.Verdict"
    ]
    schemas.write(tmp_path, verdict)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdict.schema.json"]
    assert schemas.stale(tmp_path, {**verdict, "x": models["verdict"]}) == [f"{tmp_path / 'x.schema.json'}: missing"]


def test_the_command_line_check_exits_1_listing_the_stale_files(tmp_path, capsys):
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1
    assert f"stale: {tmp_path / 'verdict.schema.json'}: missing" in capsys.readouterr().err
    assert schemas.main(["--dir", str(tmp_path)]) == 0
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_a_model_that_does_not_import_is_skipped_with_the_reason():
    models, skipped = schemas.load_models({
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


def test_another_pydantic_wording_is_not_a_changed_model(tmp_path, loaded):
    models, _ = loaded
    verdict = {"verdict": models["verdict"]}
    schemas.write(tmp_path, verdict)
    path = tmp_path / "verdict.schema.json"
    data = json.loads(path.read_text())
    data["$comment"] = "written by python -m patch_and_test.schemas with pydantic 2.99.0"
    data["title"] = "Verdict, as a newer pydantic words it"
    path.write_text(json.dumps(data))
    assert schemas.stale(tmp_path, verdict) == []
    data["properties"]["environment"] = data["properties"].pop("env")
    path.write_text(json.dumps(data))
    assert schemas.stale(tmp_path, verdict) == [f"{path}: differs from patch_and_test.job.verdict.Verdict"]
