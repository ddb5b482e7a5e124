"""The JSON schema of every report the package writes, kept under ``docs/schemas/``.

``zero3-sp docs`` writes ``docs/schemas/<name>.schema.json`` for each model in ``MODELS`` and removes the files of
names no longer listed (``rendered``); ``--check`` names every stale, missing or orphaned file.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pydantic

SUFFIX = ".schema.json"
GENERATOR = f"written by zero3-sp docs with pydantic {pydantic.VERSION}"  # each file's $comment
# name (docs/schemas/<name>.schema.json) -> the model, by dotted name; bundle verify validates by it too.
MODELS = {
    "verdict": "patch_and_test.job.verdict.Verdict",
    "affected": "patch_and_test.upstream.job.AffectedVerdict",
    "repro-report": "repro.gradscale.report.Report",
    "parity-audit": "repro.audit.report.AuditReport",
    "alst-recipe-report": "repro.alst.report.AlstReport",
    "downstream-clients-report": "repro.downstream.report.DownstreamReport",
    "downstream-run": "patch_and_test.downstream.run.DownstreamRun",
    "downstream-census": "patch_and_test.downstream.census.Census",
    "releases": "patch_and_test.tools.releases.ReleasesReport",
    "training-effect-report": "repro.training.report.TrainingReport",
    "benchmark-launch-cost": "patch_and_test.review.benchmark_reports.LaunchCost",
    "benchmark-bundle-reuse": "patch_and_test.review.benchmark_reports.BundleReuse",
    "benchmark-pipeline-overhead": "patch_and_test.review.benchmark_reports.PipelineOverhead",
    "benchmark-stress-repro": "patch_and_test.review.benchmark_reports.StressRepro",
    "benchmark-test-command": "patch_and_test.review.benchmark_reports.TestCommand",
    "benchmark-reduce-path": "patch_and_test.review.benchmark_reports.ReducePath",
    "benchmark-reduce-path-timing-launch": "patch_and_test.review.benchmark_reports.TimingLaunch",
    "benchmark-reduce-path-numerics-launch": "patch_and_test.review.benchmark_reports.NumericsLaunch",
}


def import_model(dotted: str) -> Any:
    """The class ``dotted`` names; TypeError when it is not a report model (``SCHEMA``, ``from_dict``, ...)."""
    module, _, name = dotted.rpartition(".")
    model = getattr(importlib.import_module(module), name)
    missing = [a for a in ("SCHEMA", "from_dict", "load", "json_schema") if not getattr(model, a, None)]
    if missing:
        raise TypeError(f"{dotted} is not a report model yet (no {', '.join(missing)})")
    return model


def load_models(models: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(name -> model for every one that imports, name -> why it was skipped for the others)."""
    found, skipped = {}, {}
    for name, dotted in (MODELS if models is None else models).items():
        try:
            found[name] = import_model(dotted)
        except (ImportError, AttributeError, TypeError) as err:
            skipped[name] = f"{dotted}: {type(err).__name__}: {err}"
    return found, skipped


def by_file(models: dict[str, Any], path: Path) -> Any:
    """The model whose ``FILES`` pattern ``path`` matches (a file kept without a ``schema`` key), or None."""
    return next((m for m in models.values() if getattr(m, "FILES", None) and path.match(m.FILES)), None)


def render(model: Any) -> str:
    return json.dumps({**model.json_schema(), "$comment": GENERATOR}, indent=2, sort_keys=True) + "\n"


# What every pydantic 2 release writes alike (names, types, required), whatever its wording.
_CONTRACT = ("type", "$ref", "items", "anyOf", "enum", "const", "required", "properties", "$defs")


def shape(schema: Any) -> Any:
    """The data contract of a schema: property names, their types, the required lists."""
    if isinstance(schema, list):
        return [shape(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs"):  # name -> schema: every name is data
            out[key] = {name: shape(sub) for name, sub in value.items()}
        elif key in _CONTRACT:
            out[key] = sorted(value) if key == "required" else shape(value)
    return out


def same(kept: str, rendered: str) -> bool:
    """Whether a kept schema file is the rendered one: the same text, or under another pydantic (its $comment
    says which wrote it) the same data contract, whatever that pydantic's wording."""
    if kept == rendered:
        return True
    stored = json.loads(kept)
    return stored.get("$comment") != GENERATOR and shape(stored) == shape(json.loads(rendered))


def rendered(directory: Path, listed: dict[str, str] | None = None) -> dict[Path, str | None]:
    """Every schema file as it should read (of ``MODELS``, or ``listed``); None for a file of a name no longer
    listed. A model that does not import (a warning says why) leaves its file alone."""
    models, skipped = load_models(listed)
    for why in skipped.values():
        print(f"warning: skipped {why}", file=sys.stderr)
    files: dict[Path, str | None] = {directory / f"{name}{SUFFIX}": render(model) for name, model in models.items()}
    known = set(models) | set(skipped)
    return files | {p: None for p in sorted(directory.glob(f"*{SUFFIX}")) if p.name[:-len(SUFFIX)] not in known}
