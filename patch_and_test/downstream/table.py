"""The downstream clients table, rendered from the reports of ``tox -e downstream`` only.

Documents hold it between two marker lines: ``zero3-sp docs`` renders the docs' from the kept runs
(``zero3-sp downstream keep`` copies a run's reports there), ``verify-bundle`` re-renders a bundle's.

More: docs/code/patch-and-test-downstream-doctor.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Iterator, Optional

from repro.downstream.report import ClientRow, DownstreamReport, deepspeed_label

from patch_and_test import PACKAGE_ROOT
from patch_and_test.core import templating
from patch_and_test.core.templating import Model, replace_block
from patch_and_test.core.errors import CommandParser
from patch_and_test.core.series import public_version

BEGIN = "<!-- downstream-table:begin (rendered by zero3-sp docs; do not edit) -->"
END = "<!-- downstream-table:end -->"
PHASES = ("unpatched", "patched")
REPORT = "downstream_clients.json"
KEPT_RESULTS = PACKAGE_ROOT / "docs" / "downstream-results"  # the runs the committed docs show
# The cover letters' table (plain_table): HF Trainer, accelerate, ArcticTraining; the docs show every env.
CORE_ENVS = ("downstream-arctic", "downstream-tf5.24", "downstream-tf5.25", "downstream-tf5.25-patched")


def _client_rows(root: Path, envs: tuple[str, ...] | None = None) -> Iterator[tuple]:
    """(env, phase, report, (client, client_version), the client's rows in order) under ``root`` (of ``envs`` only,
    if given), envs sorted by name, unpatched first."""
    dirs = sorted(p for p in root.iterdir()
                  if p.is_dir() and (envs is None or p.name in envs)) if root.is_dir() else []
    for d in dirs:
        for phase in PHASES:
            if not (d / phase / REPORT).is_file():
                continue
            report, by_client = DownstreamReport.load(d / phase / REPORT), {}
            for r in report.rows:
                by_client.setdefault((r.client, r.client_version), []).append(r)
            yield from ((d.name, phase, report, key, rows) for key, rows in by_client.items())


class StageResult(Model):
    stage: int
    ratio: float
    expected: float
    matches_rule: Optional[bool]
    scaled: bool  # the rule expects a gradient other than the true one


class LeftOut(Model):
    """A parameter the row's fit left out (the report's note says why), with its measured ratio per stage."""
    param: str
    ratios: list[float]


class Measured(Model):
    recipe: ClientRow  # the first row: the recipe and gate the classifier read, the loss function reached
    zero2: Optional[StageResult]
    zero3: Optional[StageResult]
    stages: list[StageResult]
    left_out: list[LeftOut]


class TableRow(Model):
    """One line of the table: a client measured on one DeepSpeed build, or a client the check does not apply to."""
    env: str
    client: str
    deepspeed: str
    report: str
    verdict: Optional[str]
    measured: Optional[Measured]


def _measured(rows) -> Measured:
    """A client's measured rows (one per stage) on one DeepSpeed build."""
    stages = [
        StageResult(stage=r.stage, ratio=r.ratio, expected=r.expected, matches_rule=r.matches_rule,
                    scaled=abs(r.expected - 1.0) > 1e-9) for r in rows
    ]
    first, by_stage = rows[0], {s.stage: s for s in reversed(stages)}
    left_out = [
        LeftOut(param=p, ratios=[r.param_ratios[p] for r in rows]) for p in first.param_ratios if p in first.note
    ]
    return Measured(recipe=first, zero2=by_stage.get(2), zero3=by_stage.get(3), stages=stages, left_out=left_out)


def table_rows(root: Path, shown_root: str) -> list[TableRow]:
    """One row per env x DeepSpeed x client; a not-applicable client once per verdict."""
    out, shown_na = [], set()
    for env, phase, rep, key, rows in _client_rows(root):
        ds = f"{public_version(rep.deepspeed_version)} {deepspeed_label(rep.deepspeed_fixed, rep.marker)}"
        row = dict(env=env, client=" ".join(key), deepspeed=ds, report=f"`{shown_root}/{env}/{phase}/{REPORT}`")
        if rows[0].status == "measured":
            out.append(TableRow(**row, verdict=None, measured=_measured([x for x in rows if x.status == "measured"])))
        elif (key, rows[0].verdict) not in shown_na:
            shown_na.add((key, rows[0].verdict))
            out.append(TableRow(**row, verdict=rows[0].verdict, measured=None))
    return out


def render(root: Path = KEPT_RESULTS, shown_root: str = "docs/downstream-results") -> str:
    """The Markdown table (no markers): one line per env x DeepSpeed x client; a not-applicable row once. By default
    the docs' table: every env of the kept runs."""
    return templating.render("downstream_table.md.j2", rows=table_rows(root, shown_root)).rstrip("\n")


def plain_table(root: Path, envs: tuple[str, ...] | None = CORE_ENVS) -> str:
    """The measured ratios, one line per client x DeepSpeed build, as plain text for a cover letter. Pure.
    ("+ proposed": a gate that reads the capability marker, i.e. the proposed transformers change.)"""
    lines = [f"  {'client':<36}{'DeepSpeed':<18}{'ZeRO-2':>8}{'ZeRO-3':>8}"]
    for _env, _phase, rep, key, rows in _client_rows(root, envs):
        measured = [x for x in rows if x.status == "measured"]
        if not measured:
            continue
        ratio = {x.stage: x.ratio for x in rows if x.ratio is not None}
        client = " ".join(key) + (" + proposed" if measured[0].gate == "marker-or-version" else "")
        ds = f"{public_version(rep.deepspeed_version)} {'patched' if rep.deepspeed_fixed else 'unpatched'}"
        lines.append(f"  {client:<36}{ds:<18}" + "".join(f"{ratio[s]:>8.2f}" if s in ratio else f"{'-':>8}"
                                                         for s in (2, 3)))
    return "\n".join(lines)


def gather(local: Path, dest: Path) -> None:
    """The reports a bundle carries: the kept runs (docs/downstream-results), then newer local runs over them."""
    import shutil

    for src in (KEPT_RESULTS, local):
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.tmp"), dirs_exist_ok=True)


def keep(src: Path, dest: Path) -> list[Path]:
    """Copy the JSON of ``src`` (results/downstream) to ``dest`` (docs/downstream-results): logs hold machine paths
    and stay behind; a run record's report and log paths become relative to its env folder."""
    written = []
    for env_dir in sorted(p for p in src.iterdir() if p.is_dir()):
        for phase in PHASES:
            report = env_dir / phase / REPORT
            if report.is_file():
                out = dest / env_dir.name / phase / REPORT
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(report.read_bytes())
                written.append(out)
        run = env_dir / "run.json"
        if run.is_file():
            data = json.loads(run.read_text())
            for check in data.get("checks", []):
                for key in ("report", "log"):
                    if check.get(key) and Path(check[key]).is_absolute():
                        check[key] = _under(Path(check[key]), env_dir)
            out = dest / env_dir.name / "run.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(data, indent=2) + "\n"
            out.write_text(re.sub(r"(?<![\w.-])/[^\s\"']*/" + re.escape(env_dir.name) + "/", "", text))
            written.append(out)
    return written


def _under(path: Path, root: Path) -> str:
    parts, name = path.parts, root.name
    return Path(*parts[parts.index(name) + 1:]).as_posix() if name in parts else path.name


def render_into(document: str, bundle: Path) -> str:
    """A bundle's copy of a document, its block rendered from the bundle's results (unchanged without a block)."""
    if BEGIN not in document:
        return document
    return replace_block(document, render(bundle / "results" / "downstream", "results/downstream"), BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="zero3-sp downstream keep", description="Copy the downstream runs' JSON into the kept runs the docs "
        "show (logs stay behind: they hold machine paths); then zero3-sp docs renders the docs' tables from them.")
    parser.add_argument("results", nargs="?", type=Path, default=Path("results") / "downstream",
                        help="the runs' folder (default: %(default)s)")
    parser.add_argument("--to", type=Path, default=KEPT_RESULTS, help="default: docs/downstream-results")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        print(f"error: {args.results}: not a folder", file=sys.stderr)
        return 2
    for path in keep(args.results, args.to):
        print(f"kept: {path}")
    return 0
