"""``zero3-sp docs``: every generated block and file of the repository, rendered again from what it shows.

``ARTIFACTS`` is the one list of them: a name, the path, the function that renders it. ``zero3-sp docs`` rewrites
each one that differs; ``--check`` writes nothing and exits 1 naming each stale one. Both exit 1 as well for what
rendering cannot mend: a failing row of docs/releases.md, a kept result under docs/ that names a series, or a
version of one, that patches/series.toml no longer has. Everything is rendered from kept data: nothing is run or
downloaded (``zero3-sp releases`` downloads; ``zero3-sp downstream keep`` keeps new downstream runs). Exit 2: an
artifact could not be rendered (a document without its marker lines, a kept file that does not validate).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pydantic

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.errors import CommandParser, PipelineError, exit_codes_markdown
from patch_and_test.core.series import Manifest, load_manifest
from patch_and_test.core.templating import replace_block
from patch_and_test.downstream import census, stacks, table
from patch_and_test.review import pr
from patch_and_test.tools import releases

Files = dict[Path, "str | None"]  # every file an artifact writes -> its text (None: the file should not exist)


@dataclass(frozen=True)
class Artifact:
    name: str
    path: str  # relative to the checkout: a file, or the folder of the files it writes
    render: Callable[[Path], Files]  # the path -> its files as they should read
    same: Callable[[str, str], bool] = str.__eq__  # (kept, rendered): does the kept text count as rendered


def block(begin: str, end: str, body: Callable[[], str]) -> Callable[[Path], Files]:
    """The lines between a document's two marker lines, rendered by ``body``; the rest is the document's own."""
    return lambda path: {path: replace_block(path.read_text(), body(), begin, end)}


# -- docs/schemas/: the JSON schema of every report the package writes, one file per model of ``MODELS``

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


def render_schema(model: Any) -> str:
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
    files: dict[Path, str | None] = {
        directory / f"{name}{SUFFIX}": render_schema(model)
        for name, model in models.items()
    }
    known = set(models) | set(skipped)
    return files | {p: None for p in sorted(directory.glob(f"*{SUFFIX}")) if p.name[:-len(SUFFIX)] not in known}


EXIT_CODES = ("<!-- exit-codes:begin (rendered by zero3-sp docs from patch_and_test.core.errors) -->",
              "<!-- exit-codes:end -->")

ARTIFACTS = (
    Artifact("stack table", "README.md", block(stacks.BEGIN, stacks.END, stacks.render)),
    Artifact("exit codes", "README.md", block(*EXIT_CODES, lambda: exit_codes_markdown().rstrip("\n"))),
    Artifact("downstream table", "docs/downstream-notice.md", block(table.BEGIN, table.END, table.render)),
    Artifact("downstream table", "docs/backport-clients.md", block(table.BEGIN, table.END, table.render)),
    Artifact("downstream census", "docs/downstream-notice.md", block(census.BEGIN, census.END, census.render)),
    Artifact("affected tests", "docs/affected-tests.md", block(pr.BEGIN, pr.END, pr.affected_table)),
    Artifact("releases", "docs/releases.md", lambda path: {path: releases.kept_markdown(path)}),
    Artifact("schemas", "docs/schemas", rendered, same=same),
)


def refresh(artifacts: tuple[Artifact, ...], root: Path, write: bool = False) -> tuple[list[str], list[str]]:
    """(the stale files, as 'name: path' lines; the artifacts that could not be rendered, and why). ``write``:
    rewrite the stale files, one artifact after the other (two blocks of one document both land)."""
    stale, errors = [], []
    for artifact in artifacts:
        try:
            files = artifact.render(root / artifact.path)
        except (OSError, ValueError, PipelineError) as err:  # pydantic's ValidationError is a ValueError
            errors.append(f"{artifact.name}: {artifact.path}: {' '.join(str(err).split())[:300]}")
            continue
        for path, text in files.items():
            kept = path.read_text() if path.is_file() else None
            if kept == text or (not write and None not in (kept, text) and artifact.same(kept, text)):
                continue
            stale.append(f"{artifact.name}: {path.relative_to(root)}")
            if write and text is None:
                path.unlink()
            elif write:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale, errors


def kept_series(root: Path, manifest: Manifest) -> list[str]:
    """Kept results under ``root`` whose top-level ``series`` names a series, or a version of one, that the manifest
    no longer has. A kept affected run must also say which version it ran (``series_version``); a downstream
    run.json records only the series' name and is checked by it."""
    now = {s.name: s.version for s in manifest.series}
    found = []
    for path in sorted(root.rglob("*.json")):
        data = json.loads(path.read_text())
        named = data.get("series") if isinstance(data, dict) else None
        where = path.relative_to(root.parent)
        for entry in named if isinstance(named, list) else [named] if named else []:
            name, version = ((entry, data.get("series_version")) if isinstance(entry, str) else
                             (entry.get("name"), entry.get("version")))
            if name not in now:
                found.append(f"{where}: series {name} is not in patches/series.toml")
            elif version is not None and version != now[name]:
                found.append(f"{where}: series {name} v{version}; patches/series.toml has v{now[name]}")
            elif version is None and path.name == "affected.json":
                found.append(f"{where}: series {name} with no series_version (which version ran is not recorded)")
    return found


def problems(root: Path) -> list[str]:
    """What rendering cannot mend: the releases table's failing rows and series, the kept results' series."""
    manifest = load_manifest()
    return releases.problems(manifest) + kept_series(root / "docs", manifest)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="zero3-sp docs", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing: exit 1 naming each stale artifact")
    args = parser.parse_args(argv)
    stale, errors = refresh(ARTIFACTS, PACKAGE_ROOT, write=not args.check)
    try:
        failing = problems(PACKAGE_ROOT)
    except (OSError, ValueError, PipelineError) as err:
        failing, errors = [], errors + [f"kept results: {' '.join(str(err).split())[:300]}"]
    for line in stale:
        print(f"{'stale' if args.check else 'updated'}: {line}")
    for line in failing:
        print(f"failing: {line}")
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    print(f"{len(ARTIFACTS)} artifacts: {len(stale)} {'stale' if args.check else 'updated'}, {len(failing)} failing"
          f"{f', {len(errors)} could not be rendered' if errors else ''}")
    return 2 if errors else 1 if failing or (args.check and stale) else 0
