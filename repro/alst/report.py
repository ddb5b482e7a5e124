"""The ALST recipe check's results: rows, the report (JSON), the verdict's pattern, the table. Pure logic."""

from __future__ import annotations

from typing import Any

from pydantic import Field, computed_field

from repro.alst.expect import TOLERANCES, fit, loss_ok
from repro.harness import scales
from repro.harness.report import PatternReport, Record, text_table


class AlstRow(Record):
    """One (recipe, stage, parameter) measurement."""

    recipe: str  # "allgather" | "own_share"
    stage: int  # ZeRO stage
    param: str  # parameter name, e.g. "model.layers.0.self_attn.q_proj.weight"
    numel: int
    path: str  # the reduction DeepSpeed used (observed for ZeRO-3)
    observed_norm: float
    expected_norm: float  # the baseline's
    ratio: float
    residual: float
    max_abs_err: float  # max |observed - target * baseline|
    max_abs_expected: float  # max |baseline|: the size of the gradient's largest entry
    target: float  # what --expect predicts
    ok: bool  # the row matches target within the tolerances
    buggy_target: float
    buggy_ok: bool
    fixed_target: float
    fixed_ok: bool

    @computed_field
    @property
    def label(self) -> str:
        """The ratio in words: "1", "2", "1/2" or "other" (``scales.label``)."""
        return scales.label(self.ratio, self.residual)


class AlstReport(PatternReport):
    """The ALST recipe check's report: a row per (recipe, stage, parameter), dp group 0's losses, the verdict."""

    SCHEMA = "zero3-sp-gradfix/alst-recipe-report/v1"

    transformers_version: str
    rows: list[AlstRow]
    losses: list[dict[str, Any]] = Field(
        default_factory=list, description="per (recipe, stage): recipe, stage, sp_loss, baseline_loss, rel_diff, ok: "
        "the full-sequence loss of dp group 0 as the sp run reports it, and the baseline's")
    tolerances: dict[str, float] = Field(default_factory=lambda: dict(TOLERANCES), description="the tolerances used")

    def table(self) -> str:
        header = ("recipe", "stage", "param", "path", "ratio", "expect", "residual", "verdict")
        lines = [(r.recipe, f"zero{r.stage}", r.param, r.path, f"{r.ratio:.6f} ({r.label})", scales.label(r.target),
                  f"{r.residual:.1e}", "ok" if r.ok else "MISMATCH") for r in self.rows]
        out = text_table(header, lines)
        if self.losses:
            out.append("")
            for x in self.losses:
                what = x.get("note") or (  # a note: no values, what another dp group found
                    f"sp {x['sp_loss']:.7f}  baseline {x['baseline_loss']:.7f}  rel diff {x['rel_diff']:.1e}")
                out.append(f"loss {x['recipe']:<9} zero{x['stage']}: {what}  {'ok' if x['ok'] else 'MISMATCH'}")
        return "\n".join(out + ["", self.summary()])

    def versions(self) -> str:
        return f"{super().versions()}, transformers {self.transformers_version}"

    def where(self, expect: str) -> bool:
        """Every row matches ``expect``'s table (they differ for ZeRO-3)."""
        return bool(self.rows) and all(getattr(r, f"{expect}_ok") for r in self.rows)

    def _holds(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows) and all(x["ok"] for x in self.losses)


def loss_entry(recipe: str, stage: int, sp_loss: float, baseline_loss: float) -> dict[str, Any]:
    rel = abs(sp_loss - baseline_loss) / max(abs(baseline_loss), 1e-30)
    return dict(recipe=recipe, stage=stage, sp_loss=sp_loss, baseline_loss=baseline_loss, rel_diff=rel,
                ok=loss_ok(rel))


def other_group_mismatch() -> dict[str, Any]:
    """Rank 0's loss entry when only another dp group's losses mismatched (every rank checks its own)."""
    return dict(recipe="*", stage=0, sp_loss=None, baseline_loss=None, rel_diff=None, ok=False,
                note="another dp group's loss mismatched")


def make_row(recipe: str, stage: int, param: str, observed, expected, sp: int, expect: str, path: str) -> AlstRow:
    """The row of one gradient: judged against --expect's scale, and against both known patterns."""
    targets = {e: scales.expected_scale(scales.default_path(stage), sp, e, recipe=recipe) for e in scales.EXPECTATIONS}
    target = targets[expect]
    scalar = scales.fit(observed, expected)
    fits = {t: fit(observed, expected, t, scalar) for t in set(targets.values())}
    f = fits[target]
    return AlstRow(recipe=recipe, stage=stage, param=param, numel=int(expected.numel()), path=path,
                   observed_norm=f.scalar.observed_norm, expected_norm=f.scalar.expected_norm, ratio=f.scalar.ratio,
                   residual=f.scalar.residual, max_abs_err=f.max_abs_err,
                   max_abs_expected=float(expected.detach().abs().max()), target=target, ok=f.ok,
                   buggy_target=targets["buggy"], buggy_ok=fits[targets["buggy"]].ok, fixed_target=targets["fixed"],
                   fixed_ok=fits[targets["fixed"]].ok)
