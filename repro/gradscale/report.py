"""The gradient-scale reproducers' results (schema ``zero3-sp-gradfix/repro-report/v1``): typed pydantic models,
to and from JSON, and the table a person reads. docs/code/repro-harness-gradscale-audit.md lists the fields."""

from __future__ import annotations

from repro.harness import scales
from repro.harness.report import PatternReport, Record, text_table


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


class Report(PatternReport):
    SCHEMA = "zero3-sp-gradfix/repro-report/v1"

    rows: list[Row]

    def table(self) -> str:
        header = ("config", "param", "numel", "path", "ratio", "expect", "verdict")
        lines = [(r.config, r.param, str(r.numel), r.path, f"{r.ratio:.4f} ({r.label})", scales.label(r.target),
                  "ok" if r.ok else "MISMATCH") for r in self.rows]
        return "\n".join(text_table(header, lines) + ["", self.summary()])

    def where(self, expect: str) -> bool:
        if expect == "fixed":
            return bool(self.rows) and all(r.fixed_ok for r in self.rows)
        return bool(self.rows) and all(r.buggy_ok for r in self.rows) and any(r.buggy_target != 1.0 for r in self.rows)

    def _holds(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)
