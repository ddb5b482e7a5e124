"""The parity audit's results: typed records, JSON, the per-point table and the summary. Pure logic.

The report is a pydantic model (``repro.harness.report.JsonReport``); its points, rows, topologies
and summary are typed records (``repro.harness.report.Record``); ``holds`` and ``exit_code`` are
derived (``computed_field``), written out, and checked against the rows when a file is read back.

JSON schema ``zero3-sp-gradfix/parity-audit/v1`` (one object):

  schema, script, deepspeed_version, torch_version, python_version, backend, device
  launcher        "local" (the audit started its ranks, one launch per topology) | "external"
  mode            "quick" | "full"
  expect          "fixed" | "buggy"
  known_file      the known-discrepancy file the rows were judged with
  known           [{id, title, factor, versions, writeup, upstream, measured_on}]
  tolerances      {dtype: norm-wise relative tolerance}
  topologies      [{world_size, sp, dp, points, exit_code, wall_time_s, message}]: one per launch
  points          one per configuration point:
      id            e.g. "z3.rs0.cg1.overflow/sp2dp1/bf16/gas2/pdf=world/postscale"
      point         the point's fields (stage, reduce_scatter, contiguous_gradients, bucket, sp,
                    dp, world, dtype, gas, predivide, predivide_factor, prescale, reduce_bucket_size)
      status        "ran" | "rejected" (DeepSpeed refused it while building the engine) | "error"
      message       DeepSpeed's exception for rejected/error points
      optimizer     the optimizer class DeepSpeed built
      seconds       time the point took on rank 0
      category      match | sp_bug | known | unexplained | rejected | error (repro.audit.expect.point_category)
      holds         the point keeps --expect
      rows          one per parameter:
          param, numel, path (the observed reduce code path), grad_dtype
          ratio         <observed, oracle> / <oracle, oracle>
          residual      ||observed - ratio * oracle|| / ||oracle||
          max_rel_dev   max_i |observed_i - ratio * oracle_i| / |ratio * oracle_i|
          label         the ratio as a fraction within tolerance ("1", "1/2", ...) or "other"
          known         ids of the known discrepancies covering the row
          target        {"fixed": s, "buggy": s}: the scale each expectation predicts
          ok            {"fixed": bool, "buggy": bool}
          at_oracle     at 1.0;  at_sp_bug  __avg_scatter_grads, sp > 1, at 1/sp
  summary
      counts          points, ran, match, sp_bug, known, unexplained, rejected, error
      failing_points  ids of the points off --expect
      known_points    {id: points covered and off 1.0}
      disagreements   rows off the oracle, grouped by (code path, cause): cause is "sp-bug",
                      known ids, or "unexplained"; with the ratios seen and example points
      rejected        grouped by DeepSpeed's message;  errors  likewise
      max_rel_err     {dtype: worst norm-wise error of a row at its expected scale}
  holds, exit_code  every point keeps --expect, and every topology ran (0), else 1; 2 when a
                    launch could not run
  wall_time_s
"""

from __future__ import annotations

import collections
import platform
from typing import Any, Iterable, Literal, Mapping, Sequence

from pydantic import Field, computed_field

from repro.audit.expect import (CATEGORIES, EXPECTATIONS, TOLERANCES, Judgement, KnownDiscrepancy, judge_row,
                                point_category, point_holds, reduce_path)
from repro.harness import scales
from repro.harness.report import JsonReport, Record, text_table

SCHEMA = "zero3-sp-gradfix/parity-audit/v1"

# What the summary names as responsible for the bug this package fixes.
SP_BUG_CODE = ("deepspeed/runtime/zero/stage3.py DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads: "
               "reduce_scatter_coalesced divides by the partition world size (sp x dp) and nothing "
               "multiplies sp back (the averaging_world_size rescale, 0.19.3+, ignores sequence_parallel_size)")

Status = Literal["ran", "rejected", "error"]
Category = Literal["match", "sp_bug", "known", "unexplained", "rejected", "error"]

# --------------------------------------------------------------------------- records


class PointFields(Record):
    """A configuration point's fields (``repro.audit.space.AuditPoint.fields``)."""

    stage: int
    reduce_scatter: bool | None
    contiguous_gradients: bool | None
    bucket: Literal["fits", "overflow"] | None
    sp: int
    dp: int
    dtype: Literal["fp32", "bf16"]
    gas: int
    predivide: Literal["1", "world", "3"]
    prescale: bool
    world: int
    predivide_factor: float
    reduce_bucket_size: int | None


class _ByExpectation(Record):
    """One value per expectation, keyed like the JSON: ``x["fixed"]`` / ``x["buggy"]``."""

    def __getitem__(self, expect: str):
        if expect not in EXPECTATIONS:
            raise KeyError(expect)
        return getattr(self, expect)

    def values(self) -> list:
        return [getattr(self, e) for e in EXPECTATIONS]


class Targets(_ByExpectation):
    """The scale each expectation predicts (None: "not a scale", see expect.NOT_A_SCALE)."""

    fixed: float | None
    buggy: float | None


class Verdicts(_ByExpectation):
    """Whether the row is where each expectation puts it."""

    fixed: bool
    buggy: bool


class MeasuredRow(Record):
    """What a rank measures for one parameter at one point (judged later, see ``judge``)."""

    param: str
    numel: int
    path: str  # the observed reduce code path
    grad_dtype: str
    ratio: float  # <observed, oracle> / <oracle, oracle>
    residual: float  # ||observed - ratio * oracle|| / ||oracle||
    max_rel_dev: float  # max_i |observed_i - ratio * oracle_i| / |ratio * oracle_i|


class Row(MeasuredRow):
    """A judged row: the measurement and where the expectations put it."""

    label: str  # the ratio as a fraction within tolerance ("1", "1/2", ...) or "other"
    known: tuple[str, ...]  # ids of the known discrepancies covering the row
    target: Targets
    ok: Verdicts
    at_oracle: bool  # at 1.0
    at_sp_bug: bool  # __avg_scatter_grads, sp > 1, at 1/sp


class MeasuredPoint(Record):
    """One configuration point as a rank ran it."""

    id: str
    point: PointFields
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


class KnownEntry(Record):
    """A known discrepancy the rows were judged with, as the report records it."""

    id: str
    title: str
    factor: str
    versions: str = ""
    writeup: str
    upstream: str
    measured_on: tuple[str, ...]


class Counts(Record):
    points: int
    ran: int
    match: int
    sp_bug: int
    known: int
    unexplained: int
    rejected: int
    error: int


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


# --------------------------------------------------------------------------- judging


def raw_row(param: str, numel: int, path: str, grad_dtype: str, ratio: float, residual: float,
            max_rel_dev: float) -> MeasuredRow:
    """What a rank measures for one parameter at one point (judged later, see ``judge``)."""
    return MeasuredRow(param=param, numel=numel, path=path, grad_dtype=grad_dtype, ratio=ratio, residual=residual,
                       max_rel_dev=max_rel_dev)


def raw_point(point_id: str, fields: Mapping[str, Any], status: str, message: str, optimizer: str, seconds: float,
              rows: Sequence[MeasuredRow]) -> MeasuredPoint:
    return MeasuredPoint(id=point_id, point=PointFields(**fields), status=status, message=message, optimizer=optimizer,
                         seconds=round(seconds, 4), rows=tuple(rows))


def _measured(point: MeasuredPoint | Mapping[str, Any]) -> MeasuredPoint:
    """The measurement of a point, raw or judged, as a record or as JSON (judgements dropped)."""
    data = point.model_dump() if isinstance(point, Record) else dict(point)
    data["rows"] = [{k: r[k] for k in MeasuredRow.model_fields} for r in data.get("rows", [])]
    return MeasuredPoint.model_validate({k: data[k] for k in MeasuredPoint.model_fields if k in data})


def judge_point(point: MeasuredPoint | Mapping[str, Any], known: Sequence[KnownDiscrepancy], expect: str,
                version: str | None = None) -> Point:
    """Label and judge every row, categorize the point (see ``judge``)."""
    p = _measured(point)
    fields = p.point.model_dump()
    rows = []
    for r in p.rows:
        j: Judgement = judge_row(fields, r.path, r.param, r.ratio, r.residual, known, version)
        rows.append(
            Row(**r.model_dump(), label=scales.label(r.ratio, r.residual,
                                                     tol=TOLERANCES[p.point.dtype].rel), known=j.known,
                target=Targets(**j.target), ok=Verdicts(**j.ok), at_oracle=j.at_oracle, at_sp_bug=j.at_sp_bug))
    return Point(**{
        **p.model_dump(), "rows": rows
    }, category=point_category(p.status, rows), holds=point_holds(p.status, rows, expect))


def judge(points: Iterable[MeasuredPoint | Point | Mapping[str, Any]], known: Sequence[KnownDiscrepancy], expect: str,
          version: str | None = None) -> list[Point]:
    """Judge every point: label / known / target / ok / at_oracle / at_sp_bug on every row,
    category / holds on every point. ``version``: the DeepSpeed version the points ran on (for the
    known discrepancies' version ranges). Idempotent: a report read back from JSON can be judged again."""
    return [judge_point(p, known, expect, version) for p in points]


def summarize(points: Sequence[Point], known: Sequence[KnownDiscrepancy], expect: str) -> Summary:
    counts = collections.Counter(p.category for p in points)
    known_points: collections.Counter = collections.Counter()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    worst: dict[str, float] = {}
    for p in points:
        dtype = p.point.dtype
        for r in p.rows:
            target = r.target[expect]
            if r.ok[expect] and target is not None:
                worst[dtype] = max(worst.get(dtype, 0.0), scales.error_at(r.ratio, r.residual, target))
            if r.at_oracle:
                continue
            cause = _cause(p, r)
            group = groups.setdefault((r.path, cause), {
                "path": r.path,
                "cause": cause,
                "rows": 0,
                "points": [],
                "ratios": collections.Counter(),
                "stages": set()
            })
            group["rows"] += 1
            group["ratios"][r.label] += 1
            group["stages"].add(p.point.stage)
            if p.id not in group["points"]:
                group["points"].append(p.id)
        for k in {k for r in p.rows if not r.at_oracle for k in r.known}:
            known_points[k] += 1
    by_id = {k.id: k for k in known}
    disagreements = [
        Disagreement(path=g["path"], cause=g["cause"], code=_code(g["cause"],
                                                                  by_id), rows=g["rows"], points=len(g["points"]),
                     stages=sorted(g["stages"]), ratios=dict(sorted(g["ratios"].items())), examples=g["points"][:5])
        for g in sorted(groups.values(), key=lambda g: (g["cause"] == "unexplained", g["path"], g["cause"]))
    ]
    return Summary(
        counts=Counts(points=len(points), ran=sum(p.status == "ran" for p in points),
                      **{c: counts.get(c, 0)
                         for c in CATEGORIES}),
        failing_points=[p.id for p in points if not p.holds],
        known_points={k.id: known_points.get(k.id, 0)
                      for k in known},
        disagreements=disagreements,
        rejected=_by_message(p for p in points if p.status == "rejected"),
        errors=_by_message(p for p in points if p.status == "error"),
        max_rel_err={d: worst[d]
                     for d in sorted(worst)},
    )


def _cause(point: Point, row: Row) -> str:
    parts = []
    if scales.bug_scales(reduce_path(row.path), point.point.sp) and (row.ok["buggy"] and not row.ok["fixed"]):
        parts.append("sp-bug")
    parts += row.known
    if not (row.ok["buggy"] or row.ok["fixed"]):
        return "unexplained"
    return " + ".join(parts) if parts else "unexplained"


def _code(cause: str, by_id: dict[str, KnownDiscrepancy]) -> list[str]:
    out = []
    for part in cause.split(" + "):
        if part == "sp-bug":
            out.append(SP_BUG_CODE)
        elif part in by_id:
            out += list(by_id[part].code)
    return out


def _by_message(points: Iterable[Point]) -> list[MessageGroup]:
    groups: dict[str, list[str]] = {}
    for p in points:
        groups.setdefault(p.message, []).append(p.id)
    return [MessageGroup(message=m, points=len(ids), examples=ids[:3]) for m, ids in sorted(groups.items())]


# --------------------------------------------------------------------------- the report


def _default_tolerances() -> dict[str, float]:
    return {d: t.rel for d, t in TOLERANCES.items()}


class AuditReport(JsonReport):
    SCHEMA = SCHEMA
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
    tolerances: dict[str, float] = Field(default_factory=_default_tolerances)
    python_version: str = Field(default_factory=platform.python_version)
    wall_time_s: float | None = None
    summary: Summary

    @classmethod
    def build(cls, *, known: Sequence[KnownDiscrepancy], known_file: str, expect: str,
              points: Sequence[MeasuredPoint | Point | Mapping[str, Any]], **kwargs) -> AuditReport:
        judged = judge(points, known, expect, kwargs.get("deepspeed_version"))
        return cls(expect=expect, known_file=known_file, points=judged, known=[_known_entry(k) for k in known],
                   summary=summarize(judged, known, expect), **kwargs)

    def rejudge(self, known: Sequence[KnownDiscrepancy], known_file: str, expect: str) -> AuditReport:
        fields = {
            name: getattr(self, name)
            for name in type(self).model_fields
            if name not in ("known", "known_file", "expect", "points", "summary", "schema_name")
        }
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
        if not self.launches_ok:
            return 2
        return 0 if self.holds else 1


def _known_entry(k: KnownDiscrepancy) -> KnownEntry:
    return KnownEntry(id=k.id, title=k.title, factor=k.factor, versions=k.versions, writeup=k.writeup,
                      upstream=k.upstream, measured_on=k.measured_on)


# --------------------------------------------------------------------------- text


def render_table(report: AuditReport, only_failing: bool = False) -> str:
    header = ("point", "path", "ratios", f"expect ({report.expect})", "category", "verdict")
    lines = []
    for p in report.points:
        if only_failing and p.holds:
            continue
        rows = p.rows
        paths = "+".join(dict.fromkeys(_short(r.path) for r in rows)) or "-"
        ratios = " ".join(f"{r.param}={r.ratio:.4f}({r.label})" for r in rows) or p.message[:70]
        targets = " ".join(dict.fromkeys(_target(r.target[report.expect]) for r in rows)) or "-"
        verdict = "ok" if p.holds else "MISMATCH" if p.status == "ran" else p.status.upper()
        if p.status == "rejected":
            verdict = "rejected"
        lines.append((p.id, paths, ratios, targets, p.category, verdict))
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
            for line in g.code:
                out.append(f"      {line}")
            out.append(f"      e.g. {g.examples[0]}")
    if s.rejected:
        out.append("rejected by DeepSpeed (not failures):")
        for m in s.rejected:
            out.append(f"  {m.points:4d}  {m.message[:150]}")
    if s.errors:
        out.append("errors:")
        for m in s.errors:
            out.append(f"  {m.points:4d}  {m.message[:150]}  e.g. {m.examples[0]}")
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


def _short(path: str) -> str:
    return {
        "__avg_scatter_grads": "z3.avg_scatter",
        "__avg_scatter_contiguous_grads": "z3.avg_scatter_contiguous"
    }.get(path, path.replace("stage_1_and_2.", "z12."))


def _target(x: float | None) -> str:
    """An expected scale as a fraction (``scales.label``); None: the expectation is "not at a scale"."""
    return "wrong" if x is None else scales.label(x)
