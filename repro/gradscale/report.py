"""Results as typed dataclasses: to and from JSON, and the table a person reads.

JSON schema ``zero3-sp-gradfix/repro-report/v1`` (one object):

  schema            str    the schema name above
  script            str    the reproducer that wrote it
  deepspeed_version str    importlib.metadata version of the DeepSpeed that ran
  torch_version     str
  python_version    str
  backend           str    "gloo" | "nccl"
  device            str    "cpu" | "cuda"
  launcher          str    "local" (the script started its ranks) | "external" (torchrun, deepspeed)
  world_size, sp, dp int
  expect            str    "fixed" | "buggy"
  rows              list   one per (config, parameter):
      config        str    e.g. "zero3 rs=True cg=True bucket=500"
      stage         int    ZeRO stage
      reduce_scatter, contiguous_gradients  bool|null;  reduce_bucket_size  int|null
      param         str    parameter name;  numel  int
      path          str    the reduction the gradient went through (observed, not predicted)
      observed_norm, expected_norm  float   L2 norms of DeepSpeed's full gradient and the oracle's
      ratio         float  <observed, expected> / <expected, expected>
      residual      float  ||observed - ratio * expected|| / ||expected||
      label         str    the ratio in words: "1.0", "1/sp", "sp", "other"
      target        float  the scale the expectation predicts for this row
      ok            bool   observed == target * expected, elementwise within tolerance
      buggy_target  float  the scale the known unpatched pattern predicts
      buggy_ok      bool   the row matches the unpatched pattern
      fixed_ok      bool   the row matches the oracle (scale 1.0)
  extra             dict   script-specific facts (e.g. the reduce bucket size used)
  holds             bool   every row ok
  pattern           str    "fixed" (every row at 1.0), "buggy" (exactly the unpatched pattern,
                           with at least one row at 1/sp) or "other"
  exit_code         int    0 holds, 1 does not hold
  wall_time_s       float  the launch's wall time (parent process start to end)
"""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path
from typing import Any

from repro.harness.files import write_json

SCHEMA = "zero3-sp-gradfix/repro-report/v1"


@dataclasses.dataclass(frozen=True)
class Row:
    config: str
    stage: int
    reduce_scatter: bool | None
    contiguous_gradients: bool | None
    reduce_bucket_size: int | None
    param: str
    numel: int
    path: str
    observed_norm: float
    expected_norm: float
    ratio: float
    residual: float
    label: str
    target: float
    ok: bool
    buggy_target: float
    buggy_ok: bool
    fixed_ok: bool


class JsonReport:
    """What every report of the package shares: its schema check, and JSON in and out.

    A subclass is a dataclass with a ``schema`` field; it sets ``SCHEMA``, names its derived
    properties in ``DERIVED`` and rebuilds its nested rows in ``_nested``.
    """

    SCHEMA = ""
    DERIVED: tuple[str, ...] = ("holds", "pattern", "exit_code")
    JSON_INDENT = 2

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update({name: getattr(self, name) for name in self.DERIVED})
        return data

    @classmethod
    def _nested(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if data.get("schema") != cls.SCHEMA:
            raise ValueError(f"not a {cls.SCHEMA} report: schema={data.get('schema')!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**cls._nested({k: v for k, v in data.items() if k in names}))

    @classmethod
    def load(cls, path: Path):
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write(self, path: Path) -> None:
        write_json(path, self.to_dict(), indent=self.JSON_INDENT)


@dataclasses.dataclass
class Report(JsonReport):

    script: str
    deepspeed_version: str
    torch_version: str
    backend: str
    device: str
    launcher: str
    world_size: int
    sp: int
    dp: int
    expect: str
    rows: list[Row]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    python_version: str = dataclasses.field(default_factory=platform.python_version)
    wall_time_s: float | None = None
    schema: str = SCHEMA

    @property
    def holds(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    @property
    def pattern(self) -> str:
        if self.rows and all(r.fixed_ok for r in self.rows):
            return "fixed"
        if self.rows and all(r.buggy_ok for r in self.rows) and any(r.buggy_target != 1.0 for r in self.rows):
            return "buggy"
        return "other"

    @property
    def exit_code(self) -> int:
        return 0 if self.holds else 1

    SCHEMA = SCHEMA

    @classmethod
    def _nested(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**kwargs, "rows": [Row(**r) for r in kwargs["rows"]]}


def render_table(report: Report) -> str:
    header = ("config", "param", "numel", "path", "ratio", "expect", "verdict")
    lines = [(r.config, r.param, str(r.numel), r.path, f"{r.ratio:.4f} ({r.label})", _fmt_scale(r.target, report.sp),
              "ok" if r.ok else "MISMATCH") for r in report.rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    summary = (f"{report.script}: DeepSpeed {report.deepspeed_version}, torch {report.torch_version}, "
               f"{report.backend}, world {report.world_size} (sp={report.sp}, dp={report.dp}), "
               f"--expect {report.expect}: {'HOLDS' if report.holds else 'DOES NOT HOLD'} "
               f"(pattern seen: {report.pattern})")
    if report.wall_time_s is not None:
        summary += f", {report.wall_time_s:.1f} s"
    return "\n".join(out + ["", summary])


def _fmt_scale(scale: float, sp: int) -> str:
    if scale == 1.0:
        return "1.0"
    if sp > 1 and abs(scale * sp - 1.0) < 1e-12:
        return f"1/{sp}"
    return f"{scale:g}"


def emit(report_dict: dict[str, Any], wall_time_s: float, json_path: Path | None) -> None:
    """The launch's report sink: add the wall time, print the table, write --json."""
    report = Report.from_dict(report_dict)
    report.wall_time_s = round(wall_time_s, 3)
    print(render_table(report), flush=True)
    if json_path is not None:
        report.write(json_path)
