"""The JSON schema of every report the package writes, kept under ``docs/schemas/``.

``python -m patch_and_test.schemas`` writes ``docs/schemas/<name>.schema.json`` for each model in
``MODELS`` (the pipeline's verdict, the reproducer families' reports, the benchmarks' results): the model's
``json_schema()`` (what its ``write`` produces, derived fields included), pretty, keys sorted, a
final newline. ``--check`` writes nothing and exits 1 listing every stale, missing or orphaned
file; a unit test runs the same check, so a model changed without regenerating fails.

The same list tells ``bundle verify`` which model validates a JSON file by its ``schema`` key (or, for a
benchmark's kept run, which has none, by its file name: ``by_file``).
A model that does not import is reported (``load_models``' second value); the unit test fails on it.

pydantic's rendering of a schema may change between its releases, while the models do not (2.13
and 2.14 differ in where they spell out ``additionalProperties``). Each file names the pydantic
that wrote it (``$comment``); with another one installed, ``stale`` compares the data contract
only (every object's property names, types and required list), so another pydantic on a fresh
machine does not read as a changed model, while a renamed, retyped or newly required field does.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any
from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.errors import CommandParser

SCHEMAS_DIR = PACKAGE_ROOT / "docs" / "schemas"
SUFFIX = ".schema.json"
# name (the file docs/schemas/<name>.schema.json) -> the model, by dotted name.
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
    "benchmark-launch-cost": "benchmarks.models.LaunchCost",
    "benchmark-bundle-reuse": "benchmarks.models.BundleReuse",
    "benchmark-pipeline-overhead": "benchmarks.models.PipelineOverhead",
    "benchmark-stress-repro": "benchmarks.models.StressRepro",
    "benchmark-test-command": "benchmarks.models.TestCommand",
    "benchmark-reduce-path": "benchmarks.models.ReducePath",
    "benchmark-reduce-path-timing-launch": "benchmarks.models.TimingLaunch",
    "benchmark-reduce-path-numerics-launch": "benchmarks.models.NumericsLaunch",
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


def by_schema(models: dict[str, Any]) -> dict[str, Any]:
    """The schema name a report carries in its ``schema`` key -> its model."""
    return {model.SCHEMA: model for model in models.values()}


def by_file(models: dict[str, Any], path: Path) -> Any:
    """The model whose ``FILES`` pattern ``path`` matches (a file kept without a ``schema`` key), or None."""
    return next((m for m in models.values() if getattr(m, "FILES", None) and path.match(m.FILES)), None)


def _generator() -> str:
    import pydantic

    return f"written by python -m patch_and_test.schemas with pydantic {pydantic.VERSION}"


def render(model: Any) -> str:
    return json.dumps({**model.json_schema(), "$comment": _generator()}, indent=2, sort_keys=True) + "\n"


# What a schema says about the data that every pydantic 2 release writes alike: names, types, required.
# (Wording differs between releases, and so does where ``additionalProperties: false`` is spelt out.)
_CONTRACT = ("type", "$ref", "items", "anyOf", "enum", "const", "required", "properties", "$defs")


def shape(schema: Any) -> Any:
    """The data contract of a schema: property names, their types, the required lists."""
    if isinstance(schema, list):
        return [shape(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key not in _CONTRACT:
            continue
        if key in ("properties", "$defs"):  # name -> schema: the names are data, keep every one
            out[key] = {name: shape(sub) for name, sub in value.items()}
        elif key == "required":
            out[key] = sorted(value)
        else:
            out[key] = shape(value)
    return out


def _differs(path: Path, model: Any) -> bool:
    text, want = path.read_text(), render(model)
    if text == want:
        return False
    stored = json.loads(text)
    if stored.get("$comment") == _generator():
        return True  # same pydantic, other text: the model changed
    return shape(stored) != shape(json.loads(want))


def stale(directory: Path, models: dict[str, Any], skipped: dict[str, str] | None = None) -> list[str]:
    """Every file of ``directory`` that differs from what the models give, one line each."""
    problems = []
    for name, model in sorted(models.items()):
        path = directory / f"{name}{SUFFIX}"
        if not path.exists():
            problems.append(f"{path}: missing")
        elif _differs(path, model):
            problems.append(f"{path}: differs from {model.__module__}.{model.__qualname__}")
    known = set(models) | set(skipped or {})
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        if path.name[:-len(SUFFIX)] not in known:
            problems.append(f"{path}: no model in patch_and_test.review.schemas.MODELS")
    return problems


def write(directory: Path, models: dict[str, Any], skipped: dict[str, str] | None = None) -> list[Path]:
    """Write every model's schema; remove the files of names no longer listed. The files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in sorted(models.items()):
        path = directory / f"{name}{SUFFIX}"
        text = render(model)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    known = set(models) | set(skipped or {})
    for path in directory.glob(f"*{SUFFIX}"):
        if path.name[:-len(SUFFIX)] not in known:
            path.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m patch_and_test.schemas", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    parser.add_argument("--dir", type=Path, default=SCHEMAS_DIR, help=f"default: {SCHEMAS_DIR}")
    args = parser.parse_args(argv)
    models, skipped = load_models()
    for why in skipped.values():
        print(f"warning: skipped {why}", file=sys.stderr)
    if args.check:
        problems = stale(args.dir, models, skipped)
        for p in problems:
            print(f"stale: {p}", file=sys.stderr)
        print(f"{args.dir}: {len(models)} schema(s) checked, "
              f"{'up to date' if not problems else f'{len(problems)} stale (python -m patch_and_test.schemas)'}")
        return 1 if problems else 0
    written = write(args.dir, models, skipped)
    print(f"{args.dir}: {len(models)} schema(s), {len(written)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
