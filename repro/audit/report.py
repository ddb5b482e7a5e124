"""The parity audit's results: JSON, the per-point table and the summary. Pure logic.

JSON schema ``zero3-sp-gradfix/parity-audit/v1`` (one object):

  schema, script, deepspeed_version, torch_version, python_version, backend, device
  launcher        "local" (the audit started its ranks, one launch per topology) | "external"
  mode            "quick" | "full"
  expect          "fixed" | "buggy"
  known_file      the known-discrepancy file the rows were judged with
  known           [{id, title, factor, writeup, upstream, measured_on}]
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
      category      match | sp_bug | known | unexplained | rejected | error (audit_expect.point_category)
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
      counts          points, ran, rejected, error, match, sp_bug, known, unexplained
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
import dataclasses
import platform
from fractions import Fraction
from typing import Any, Iterable, Sequence

from repro.report import JsonReport
from repro.audit_expect import (AVG_SCATTER, CATEGORIES, TOLERANCES, KnownDiscrepancy, error_at, judge_row,
                                point_category, point_holds, ratio_label)

SCHEMA = "zero3-sp-gradfix/parity-audit/v1"

# What the summary names as responsible for the bug this package fixes.
SP_BUG_CODE = ("deepspeed/runtime/zero/stage3.py DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads: "
               "reduce_scatter_coalesced divides by the partition world size (sp x dp) and nothing "
               "multiplies sp back (the averaging_world_size rescale, 0.19.3+, ignores sequence_parallel_size)")


def raw_row(param: str, numel: int, path: str, grad_dtype: str, ratio: float, residual: float,
            max_rel_dev: float) -> dict[str, Any]:
    """What a rank measures for one parameter at one point (judged later, see ``judge``)."""
    return dict(param=param, numel=numel, path=path, grad_dtype=grad_dtype, ratio=ratio, residual=residual,
                max_rel_dev=max_rel_dev)


def raw_point(point_id: str, fields: dict[str, Any], status: str, message: str, optimizer: str, seconds: float,
              rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return dict(id=point_id, point=dict(fields), status=status, message=message, optimizer=optimizer,
                seconds=round(seconds, 4), rows=list(rows))


def judge(points: Iterable[dict[str, Any]], known: Sequence[KnownDiscrepancy], expect: str,
          version: str | None = None) -> list[dict[str, Any]]:
    """Add label / known / target / ok / at_oracle / at_sp_bug to every row, category / holds to
    every point. ``version``: the DeepSpeed version the points ran on (for the known
    discrepancies' version ranges). Idempotent: a report read back from JSON can be judged again."""
    out = []
    for p in points:
        p = dict(p)
        rows = []
        for r in p.get("rows", []):
            j = judge_row(p["point"], r["path"], r["param"], r["ratio"], r["residual"], known, version)
            rows.append(dict(r, label=ratio_label(r["ratio"], r["residual"], p["point"]["dtype"]), known=list(j.known),
                             target=j.target, ok=j.ok, at_oracle=j.at_oracle, at_sp_bug=j.at_sp_bug))
        p["rows"] = rows
        p["category"] = point_category(p["status"], rows)
        p["holds"] = point_holds(p["status"], rows, expect)
        out.append(p)
    return out


def summarize(points: Sequence[dict[str, Any]], known: Sequence[KnownDiscrepancy], expect: str) -> dict[str, Any]:
    counts = collections.Counter(p["category"] for p in points)
    summary: dict[str, Any] = {
        "counts": {"points": len(points), "ran": sum(p["status"] == "ran" for p in points),
                   **{c: counts.get(c, 0) for c in CATEGORIES}},
        "failing_points": [p["id"] for p in points if not p["holds"]],
    }
    known_points = collections.Counter()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    worst: dict[str, float] = {}
    for p in points:
        for r in p["rows"]:
            dtype = p["point"]["dtype"]
            if r["ok"][expect] and r["target"][expect] is not None:
                err = error_at(r["ratio"], r["residual"], r["target"][expect])
                worst[dtype] = max(worst.get(dtype, 0.0), err)
            if r["at_oracle"]:
                continue
            cause = _cause(p, r)
            group = groups.setdefault((r["path"], cause), {"path": r["path"], "cause": cause, "rows": 0, "points": [],
                                                           "ratios": collections.Counter(), "stages": set()})
            group["rows"] += 1
            group["ratios"][r["label"]] += 1
            group["stages"].add(p["point"]["stage"])
            if p["id"] not in group["points"]:
                group["points"].append(p["id"])
        covering = {k for r in p["rows"] if not r["at_oracle"] for k in r["known"]}
        for k in covering:
            known_points[k] += 1
    by_id = {k.id: k for k in known}
    summary["known_points"] = {k.id: known_points.get(k.id, 0) for k in known}
    summary["disagreements"] = [{
        "path": g["path"], "cause": g["cause"], "code": _code(g["cause"], by_id), "rows": g["rows"],
        "points": len(g["points"]), "stages": sorted(g["stages"]), "ratios": dict(sorted(g["ratios"].items())),
        "examples": g["points"][:5]
    } for g in sorted(groups.values(), key=lambda g: (g["cause"] == "unexplained", g["path"], g["cause"]))]
    summary["rejected"] = _by_message(p for p in points if p["status"] == "rejected")
    summary["errors"] = _by_message(p for p in points if p["status"] == "error")
    summary["max_rel_err"] = {d: worst[d] for d in sorted(worst)}
    return summary


def _cause(point: dict[str, Any], row: dict[str, Any]) -> str:
    parts = []
    if row["path"] == AVG_SCATTER and point["point"]["sp"] > 1 and (row["ok"]["buggy"] and not row["ok"]["fixed"]):
        parts.append("sp-bug")
    parts += row["known"]
    if not (row["ok"]["buggy"] or row["ok"]["fixed"]):
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


def _by_message(points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[str]] = {}
    for p in points:
        groups.setdefault(p["message"], []).append(p["id"])
    return [{"message": m, "points": len(ids), "examples": ids[:3]} for m, ids in sorted(groups.items())]


@dataclasses.dataclass
class AuditReport(JsonReport):
    script: str
    deepspeed_version: str
    torch_version: str
    backend: str
    device: str
    launcher: str
    mode: str
    expect: str
    known_file: str
    known: list[dict[str, Any]]
    topologies: list[dict[str, Any]]
    points: list[dict[str, Any]]
    tolerances: dict[str, float] = dataclasses.field(default_factory=lambda: {d: t.rel for d, t in TOLERANCES.items()})
    python_version: str = dataclasses.field(default_factory=platform.python_version)
    wall_time_s: float | None = None
    schema: str = SCHEMA
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, *, known: Sequence[KnownDiscrepancy], known_file: str, expect: str, points: Sequence[dict[str, Any]],
              **kwargs) -> AuditReport:
        judged = judge(points, known, expect, kwargs.get("deepspeed_version"))
        report = cls(expect=expect, known_file=known_file, points=judged, known=[_known_entry(k) for k in known],
                     **kwargs)
        report.summary = summarize(judged, known, expect)
        return report

    def rejudge(self, known: Sequence[KnownDiscrepancy], known_file: str, expect: str) -> AuditReport:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("known", "known_file", "expect", "points", "summary", "schema")}
        return AuditReport.build(known=known, known_file=known_file, expect=expect, points=self.points, **fields)

    @property
    def launches_ok(self) -> bool:
        return bool(self.topologies) and all(t["exit_code"] in (0, 1) for t in self.topologies)

    @property
    def holds(self) -> bool:
        return self.launches_ok and bool(self.points) and all(p["holds"] for p in self.points)

    @property
    def exit_code(self) -> int:
        if not self.launches_ok:
            return 2
        return 0 if self.holds else 1

    SCHEMA = SCHEMA
    DERIVED = ("holds", "exit_code")
    JSON_INDENT = 1


def _known_entry(k: KnownDiscrepancy) -> dict[str, Any]:
    return dict(id=k.id, title=k.title, factor=k.factor, versions=k.versions, writeup=k.writeup, upstream=k.upstream,
                measured_on=list(k.measured_on))


# --------------------------------------------------------------------------- text


def render_table(report: AuditReport, only_failing: bool = False) -> str:
    header = ("point", "path", "ratios", f"expect ({report.expect})", "category", "verdict")
    lines = []
    for p in report.points:
        if only_failing and p["holds"]:
            continue
        rows = p["rows"]
        paths = "+".join(dict.fromkeys(_short(r["path"]) for r in rows)) or "-"
        ratios = " ".join(f"{r['param']}={r['ratio']:.4f}({r['label']})" for r in rows) or p["message"][:70]
        targets = " ".join(dict.fromkeys(_fraction(r["target"][report.expect]) for r in rows)) or "-"
        verdict = "ok" if p["holds"] else "MISMATCH" if p["status"] == "ran" else p["status"].upper()
        if p["status"] == "rejected":
            verdict = "rejected"
        lines.append((p["id"], paths, ratios, targets, p["category"], verdict))
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(header)]
    widths[2] = min(widths[2], 60)
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line).rstrip() for line in lines]
    return "\n".join(out)


def render_summary(report: AuditReport) -> str:
    s = report.summary
    c = s["counts"]
    out = [
        f"parity audit ({report.mode}): DeepSpeed {report.deepspeed_version}, torch {report.torch_version}, "
        f"{report.backend}, topologies {', '.join(_topo(t) for t in report.topologies)}",
        f"points {c['points']}: ran {c['ran']}, rejected {c['rejected']}, error {c['error']} | "
        f"match {c['match']}, at 1/sp (sp bug) {c['sp_bug']}, known discrepancies {c['known']}, "
        f"unexplained {c['unexplained']}",
    ]
    if s["disagreements"]:
        out.append("disagreements with the oracle, by code path:")
        for g in s["disagreements"]:
            ratios = ", ".join(f"{k} x{v}" for k, v in g["ratios"].items())
            out.append(f"  {g['path']}  [{g['cause']}]  {g['points']} points, {g['rows']} gradients, "
                       f"stages {g['stages']}, ratios {ratios}")
            for line in g["code"]:
                out.append(f"      {line}")
            out.append(f"      e.g. {g['examples'][0]}")
    if s["rejected"]:
        out.append("rejected by DeepSpeed (not failures):")
        for g in s["rejected"]:
            out.append(f"  {g['points']:4d}  {g['message'][:150]}")
    if s["errors"]:
        out.append("errors:")
        for g in s["errors"]:
            out.append(f"  {g['points']:4d}  {g['message'][:150]}  e.g. {g['examples'][0]}")
    for t in report.topologies:
        if t["exit_code"] not in (0, 1):
            out.append(f"launch {_topo(t)} failed (exit {t['exit_code']}): {t.get('message', '')}")
    if s["max_rel_err"]:
        out.append("worst error at the expected scale: " +
                   ", ".join(f"{d} {e:.2e} (tolerance {report.tolerances[d]:g})" for d, e in s["max_rel_err"].items()))
    verdict = "HOLDS" if report.holds else "DOES NOT HOLD"
    line = f"--expect {report.expect}: {verdict}"
    if s["failing_points"]:
        line += f" ({len(s['failing_points'])} points off the expectation, e.g. {s['failing_points'][0]})"
    if report.wall_time_s is not None:
        line += f", {report.wall_time_s:.1f} s"
    out.append(line)
    return "\n".join(out)


def _topo(t: dict[str, Any]) -> str:
    return f"sp{t['sp']}dp{t['dp']}"


def _short(path: str) -> str:
    return {"__avg_scatter_grads": "z3.avg_scatter", "__avg_scatter_contiguous_grads": "z3.avg_scatter_contiguous"}.get(
        path, path.replace("stage_1_and_2.", "z12."))


def _fraction(x: float | None) -> str:
    if x is None:
        return "wrong"
    f = Fraction(x).limit_denominator(64)
    return str(f) if abs(float(f) - x) < 1e-12 else f"{x:g}"
