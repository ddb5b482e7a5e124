"""The gradient-scale reproducers' results: typed pydantic models, to and from JSON, and the table a person reads.

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
      label         str    the ratio in words (``scales.label``): "1", "1/2", "2", ..., "other"
                           (files written before the harness's label say "1.0" for "1")
      target        float  the scale the expectation predicts for this row
      ok            bool   observed == target * expected, elementwise within tolerance
      buggy_target  float  the scale the known unpatched pattern predicts
      buggy_ok      bool   the row matches the unpatched pattern
      fixed_ok      bool   the row matches the oracle (scale 1.0)
  extra             dict   script-specific facts (e.g. the reduce bucket size used)
  holds             bool   every row ok                                              (derived)
  pattern           str    "fixed" (every row at 1.0), "buggy" (exactly the unpatched pattern,
                           with at least one row at 1/sp) or "other"                 (derived)
  exit_code         int    0 holds, 1 does not hold                                  (derived)
  wall_time_s       float  the launch's wall time (parent process start to end)

The derived fields are written for readers without this package; reading a file back recomputes
them and rejects one whose stored values disagree with its rows (``JsonReport.from_dict``).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import computed_field

from repro.harness import scales
from repro.harness.report import LaunchReport, Record, text_table

SCHEMA = "zero3-sp-gradfix/repro-report/v1"


class Row(Record):
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


class Report(LaunchReport):
    SCHEMA: ClassVar[str] = SCHEMA

    rows: list[Row]

    def table(self) -> str:
        return render_table(self)

    @computed_field
    @property
    def holds(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    @computed_field
    @property
    def pattern(self) -> str:
        if self.rows and all(r.fixed_ok for r in self.rows):
            return "fixed"
        if self.rows and all(r.buggy_ok for r in self.rows) and any(r.buggy_target != 1.0 for r in self.rows):
            return "buggy"
        return "other"

    @computed_field
    @property
    def exit_code(self) -> int:
        return 0 if self.holds else 1


def render_table(report: Report) -> str:
    header = ("config", "param", "numel", "path", "ratio", "expect", "verdict")
    lines = [(r.config, r.param, str(r.numel), r.path, f"{r.ratio:.4f} ({r.label})", scales.label(r.target),
              "ok" if r.ok else "MISMATCH") for r in report.rows]
    return "\n".join(text_table(header, lines) + ["", report.summary()])


emit = Report.emit
