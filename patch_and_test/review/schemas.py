"""The JSON schema of every report the package writes, kept under ``docs/schemas/``.

``python -m patch_and_test.schemas`` writes ``docs/schemas/<name>.schema.json`` for each model in ``MODELS``;
``--check`` writes nothing and exits 1 listing every stale, missing or orphaned file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pydantic

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.errors import CommandParser

SCHEMAS_DIR = PACKAGE_ROOT / "docs" / "schemas"
SUFFIX = ".schema.json"
GENERATOR = f"written by python -m patch_and_test.schemas with pydantic {pydantic.VERSION}"  # each file's $comment
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


def _differs(path: Path, model: Any) -> bool:
    text, want = path.read_text(), render(model)
    if text == want:
        return False
    stored = json.loads(text)
    # Same pydantic, other text: the model changed; another pydantic: compare the data contract only.
    return stored.get("$comment") == GENERATOR or shape(stored) != shape(json.loads(want))


def _orphans(directory: Path, models: dict[str, Any], skipped: dict[str, str] | None) -> list[Path]:
    known = set(models) | set(skipped or {})
    return [p for p in sorted(directory.glob(f"*{SUFFIX}")) if p.name[:-len(SUFFIX)] not in known]


def stale(directory: Path, models: dict[str, Any], skipped: dict[str, str] | None = None) -> list[str]:
    """Every file of ``directory`` that differs from what the models give, one line each."""
    problems = []
    for name, model in sorted(models.items()):
        path = directory / f"{name}{SUFFIX}"
        if not path.exists():
            problems.append(f"{path}: missing")
        elif _differs(path, model):
            problems.append(f"{path}: differs from {model.__module__}.{model.__qualname__}")
    return problems + [
        f"{p}: no model in patch_and_test.review.schemas.MODELS" for p in _orphans(directory, models, skipped)
    ]


def write(directory: Path, models: dict[str, Any], skipped: dict[str, str] | None = None) -> list[Path]:
    """Write every model's schema; remove the files of names no longer listed. The files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in sorted(models.items()):
        path, text = directory / f"{name}{SUFFIX}", render(model)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    for path in _orphans(directory, models, skipped):
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
