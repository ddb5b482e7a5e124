"""The parity audit's results (schema ``zero3-sp-gradfix/parity-audit/v1``): typed records, JSON, the per-point
table and the summary. Pure logic; docs/code/repro-harness-gradscale-audit.md lists the fields."""

from __future__ import annotations

import collections
import platform
from typing import Any, Iterable, Literal, Mapping, Sequence

from pydantic import Field, computed_field, create_model

from repro.audit.expect import (CATEGORIES, TOLERANCES, KnownDiscrepancy, KnownEntry, MeasuredRow, Row, judge_row,
                                point_category, point_holds, reduce_path)
from repro.audit.space import AuditPoint
from repro.harness import scales
from repro.harness.report import JsonReport, Record, text_table

# What the summary names as responsible for the bug this package fixes.
SP_BUG_CODE = ("deepspeed/runtime/zero/stage3.py DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads: "
               "reduce_scatter_coalesced divides by the partition world size (sp x dp) and nothing "
               "multiplies sp back (the averaging_world_size rescale, 0.19.3+, ignores sequence_parallel_size)")

Status = Literal["ran", "rejected", "error"]
Category = Literal[CATEGORIES]


class MeasuredPoint(Record):
    """One configuration point as a rank ran it."""

    id: str
    point: AuditPoint
    status: Status
    message: str  # DeepSpeed's exception for rejected / error points
    optimizer: str
    seconds: float
    rows: tuple[MeasuredRow, ...]


class Point(MeasuredPoint):
    """A judged point."""

    rows: tuple[Row, ...]
    category: Category
    holds: bool  # the point keeps the report's --expect


class TopologyRun(Record):
    """One launch: one (world size, sp) and its points."""

    world_size: int
    sp: int
    dp: int
    points: int
    exit_code: int
    wall_time_s: float | None
    message: str


Counts = create_model("Counts", __base__=Record, points=int, ran=int, **{c: int for c in CATEGORIES})


class Disagreement(Record):
    """Rows off the oracle sharing a code path and a cause."""

    path: str
    cause: str  # "sp-bug", known ids joined by " + ", or "unexplained"
    code: tuple[str, ...]
    rows: int
    points: int
    stages: tuple[int, ...]
    ratios: dict[str, int]  # label -> rows
    examples: tuple[str, ...]


class MessageGroup(Record):
    message: str
    points: int
    examples: tuple[str, ...]


class Summary(Record):
    counts: Counts
    failing_points: tuple[str, ...]
    known_points: dict[str, int]  # known id -> points covered and off 1.0
    disagreements: tuple[Disagreement, ...]
    rejected: tuple[MessageGroup, ...]
    errors: tuple[MessageGroup, ...]
    max_rel_err: dict[str, float]  # dtype -> worst norm-wise error of a row at its expected scale


def raw_point(fields: AuditPoint | Mapping[str, Any], status: str, message: str, optimizer: str, seconds: float,
              rows: Sequence[MeasuredRow]) -> MeasuredPoint:
    point = AuditPoint.model_validate(fields)
    return MeasuredPoint(id=point.id, point=point, status=status, message=message, optimizer=optimizer,
                         seconds=round(seconds, 4), rows=tuple(rows))


def _measured(point: MeasuredPoint | Mapping[str, Any]) -> MeasuredPoint:
    """The measurement of a point, raw or judged, as a record or as JSON (judgements dropped)."""
    data = point.model_dump() if isinstance(point, Record) else dict(point)
    data["rows"] = [{k: r[k] for k in MeasuredRow.model_fields} for r in data.get("rows", [])]
    return MeasuredPoint.model_validate({k: data[k] for k in MeasuredPoint.model_fields if k in data})


def judge_point(point: MeasuredPoint | Mapping[str, Any], known: Sequence[KnownDiscrepancy], expect: str,
                version: str | None = None) -> Point:
    """Judge every row, categorize the point (``version``: DeepSpeed's, for known-discrepancy ranges); idempotent."""
    p = _measured(point)
    fields = p.point.model_dump()
    rows = [judge_row(fields, r, known, version) for r in p.rows]
    return Point(**dict(p.model_dump(), rows=rows), category=point_category(p.status, rows),
                 holds=point_holds(p.status, rows, expect))


def summarize(points: Sequence[Point], known: Sequence[KnownDiscrepancy], expect: str) -> Summary:
    groups: dict[tuple[str, str], list[tuple[str, str, int]]] = {}  # (path, cause) -> (point, label, stage) a row
    worst: dict[str, float] = {}
    for p in points:
        for r in p.rows:
            if r.ok[expect] and (target := r.target[expect]) is not None:
                worst[p.point.dtype] = max(worst.get(p.point.dtype, 0.0), scales.error_at(r.ratio, r.residual, target))
            if not r.at_oracle:
                groups.setdefault((r.path, _cause(p, r)), []).append((p.id, r.label, p.point.stage))
    code_of = {**{k.id: k.code for k in known}, "sp-bug": (SP_BUG_CODE, )}
    disagreements = []
    for path, cause in sorted(groups, key=lambda key: (key[1] == "unexplained", *key)):
        ids, labels, stages = zip(*groups[path, cause])
        ids = list(dict.fromkeys(ids))  # first-seen order
        code = [c for part in cause.split(" + ") for c in code_of.get(part, ())]
        disagreements.append(
            Disagreement(path=path, cause=cause, code=code, rows=len(labels), points=len(ids),
                         stages=sorted(set(stages)), ratios=dict(sorted(collections.Counter(labels).items())),
                         examples=ids[:5]))
    # per known id: the points it covers off 1.0
    known_points = {k.id: sum(any(k.id in r.known and not r.at_oracle for r in p.rows) for p in points) for k in known}
    counts = {c: sum(p.category == c for p in points) for c in CATEGORIES}
    return Summary(counts=Counts(points=len(points), ran=sum(p.status == "ran" for p in points),
                                 **counts), failing_points=[p.id for p in points if not p.holds],
                   known_points=known_points, disagreements=disagreements, rejected=_by_message(points, "rejected"),
                   errors=_by_message(points, "error"), max_rel_err=dict(sorted(worst.items())))


def _cause(point: Point, row: Row) -> str:
    sp_bug = scales.bug_scales(reduce_path(row.path), point.point.sp) and row.ok["buggy"] and not row.ok["fixed"]
    if not (row.ok["buggy"] or row.ok["fixed"]):
        return "unexplained"
    return " + ".join(["sp-bug"] * sp_bug + list(row.known)) or "unexplained"


def _by_message(points: Iterable[Point], status: str) -> list[MessageGroup]:
    groups: dict[str, list[str]] = {}
    for p in points:
        if p.status == status:
            groups.setdefault(p.message, []).append(p.id)
    return [MessageGroup(message=m, points=len(ids), examples=ids[:3]) for m, ids in sorted(groups.items())]


class AuditReport(JsonReport):
    SCHEMA = "zero3-sp-gradfix/parity-audit/v1"
    JSON_INDENT = 1

    script: str
    deepspeed_version: str
    torch_version: str
    backend: str
    device: str
    launcher: Literal["local", "external"]
    mode: Literal["quick", "full"]
    expect: Literal["fixed", "buggy"]
    known_file: str
    known: tuple[KnownEntry, ...]
    topologies: tuple[TopologyRun, ...]
    points: tuple[Point, ...]
    tolerances: dict[str, float] = Field(default_factory=lambda: dict(TOLERANCES))
    python_version: str = Field(default_factory=platform.python_version)
    wall_time_s: float | None = None
    summary: Summary

    @classmethod
    def build(cls, *, known: Sequence[KnownDiscrepancy], known_file: str, expect: str,
              points: Sequence[MeasuredPoint | Point | Mapping[str, Any]], **kwargs) -> AuditReport:
        judged = [judge_point(p, known, expect, kwargs.get("deepspeed_version")) for p in points]
        entries = [KnownEntry(**{f: getattr(k, f) for f in KnownEntry.model_fields}) for k in known]
        return cls(expect=expect, known_file=known_file, points=judged, known=entries,
                   summary=summarize(judged, known, expect), **kwargs)

    def rejudge(self, known: Sequence[KnownDiscrepancy], known_file: str, expect: str) -> AuditReport:
        rebuilt = ("known", "known_file", "expect", "points", "summary", "schema_name")
        fields = {name: getattr(self, name) for name in type(self).model_fields if name not in rebuilt}
        return type(self).build(known=known, known_file=known_file, expect=expect, points=self.points, **fields)

    @property
    def launches_ok(self) -> bool:
        return bool(self.topologies) and all(t.exit_code in (0, 1) for t in self.topologies)

    @computed_field
    @property
    def holds(self) -> bool:
        """Every point keeps --expect and every topology ran."""
        return self.launches_ok and bool(self.points) and all(p.holds for p in self.points)

    @computed_field
    @property
    def exit_code(self) -> int:
        """0 holds, 1 does not, 2 a launch could not run."""
        return 2 if not self.launches_ok else 0 if self.holds else 1

    def table(self, only_failing: bool = False) -> str:
        header = ("point", "path", "ratios", f"expect ({self.expect})", "category", "verdict")
        lines = []
        for p in self.points:
            if only_failing and p.holds:
                continue
            paths = "+".join(
                dict.fromkeys(_SHORT.get(r.path, r.path.replace("stage_1_and_2.", "z12.")) for r in p.rows))
            ratios = " ".join(f"{r.param}={r.ratio:.4f}({r.label})" for r in p.rows) or p.message[:70]
            # an expected scale as a fraction; None: the expectation is "not at a scale"
            targets = [("wrong" if r.target[self.expect] is None else scales.label(r.target[self.expect]))
                       for r in p.rows]
            targets = " ".join(dict.fromkeys(targets)) or "-"
            verdict = ("rejected" if p.status == "rejected" else
                       "ok" if p.holds else "MISMATCH" if p.status == "ran" else p.status.upper())
            lines.append((p.id, paths or "-", ratios, targets, p.category, verdict))
        return "\n".join(text_table(header, lines, max_widths={2: 60}))


def render_summary(report: AuditReport) -> str:
    s = report.summary
    c = s.counts
    out = [
        f"parity audit ({report.mode}): DeepSpeed {report.deepspeed_version}, torch {report.torch_version}, "
        f"{report.backend}, topologies {', '.join(_topo(t) for t in report.topologies)}",
        f"points {c.points}: ran {c.ran}, rejected {c.rejected}, error {c.error} | "
        f"match {c.match}, at 1/sp (sp bug) {c.sp_bug}, known discrepancies {c.known}, "
        f"unexplained {c.unexplained}",
    ]
    if s.disagreements:
        out.append("disagreements with the oracle, by code path:")
        for g in s.disagreements:
            ratios = ", ".join(f"{k} x{v}" for k, v in g.ratios.items())
            out.append(f"  {g.path}  [{g.cause}]  {g.points} points, {g.rows} gradients, "
                       f"stages {list(g.stages)}, ratios {ratios}")
            out += [f"      {line}" for line in g.code] + [f"      e.g. {g.examples[0]}"]
    if s.rejected:
        out += ["rejected by DeepSpeed (not failures):"] + [f"  {m.points:4d}  {m.message[:150]}" for m in s.rejected]
    if s.errors:
        out += ["errors:"] + [f"  {m.points:4d}  {m.message[:150]}  e.g. {m.examples[0]}" for m in s.errors]
    for t in report.topologies:
        if t.exit_code not in (0, 1):
            out.append(f"launch {_topo(t)} failed (exit {t.exit_code}): {t.message}")
    if s.max_rel_err:
        out.append("worst error at the expected scale: " +
                   ", ".join(f"{d} {e:.2e} (tolerance {report.tolerances[d]:g})" for d, e in s.max_rel_err.items()))
    verdict = "HOLDS" if report.holds else "DOES NOT HOLD"
    line = f"--expect {report.expect}: {verdict}"
    if s.failing_points:
        line += f" ({len(s.failing_points)} points off the expectation, e.g. {s.failing_points[0]})"
    if report.wall_time_s is not None:
        line += f", {report.wall_time_s:.1f} s"
    out.append(line)
    return "\n".join(out)


def _topo(t: TopologyRun) -> str:
    return f"sp{t.sp}dp{t.dp}"


_SHORT = {"__avg_scatter_grads": "z3.avg_scatter", "__avg_scatter_contiguous_grads": "z3.avg_scatter_contiguous"}
