"""The ALST recipe check's pure logic: expectation table, tolerances, verdict, report, table.

No DeepSpeed and no transformers here (torch only for the tensor comparison), so all of it is
unit-tested without ranks.

Measured quantity: for one ZeRO stage and one loss recipe, the ratio of DeepSpeed's full
gradient under Ulysses sequence parallelism (sp ranks each holding a slice of the sequence)
to the gradient of the same samples without sequence parallelism (the baseline: the mean
over the dp groups of each group's full-sequence gradient, in plain torch).

Recipes (what each sp rank passes to ``engine.backward``):

* ``allgather``: DeepSpeed's ALST recipe (tutorial ``ulysses-alst-sequence-parallelism.md``,
  ``tests/unit/ulysses_alst/test_ulysses_sp_hf.py``): the shard losses are gathered with the
  differentiable ``torch.distributed.nn.functional.all_gather``, weighted by their tokens, and
  every rank backprops that same full-sequence loss. The all_gather's backward sums the sp
  ranks' identical upstream gradients, so each rank's local gradient is sp times its share.
* ``own_share``: each rank backprops only its own token-weighted share,
  ``loss_r * tokens_r / sum(tokens)`` (the token total from a non-differentiable all_reduce),
  which is the convention DeepSpeed's reductions assume: sum over sp, mean over dp.

Expected ratios (``EXPECTED``):

| recipe    | stage | unpatched (``buggy``) | with the fix (``fixed``) |
|-----------|-------|-----------------------|--------------------------|
| allgather | 2     | sp                    | sp                       |
| allgather | 3     | 1.0                   | sp                       |
| own_share | 2     | 1.0                   | 1.0                      |
| own_share | 3     | 1/sp                  | 1.0                      |

(ZeRO-3's default ``reduce_scatter=True`` path, ``__avg_scatter_grads``, divides by the whole
world instead of world/sp before the fix.)
"""

from __future__ import annotations

import dataclasses
import math
import platform
from fractions import Fraction
from pathlib import Path
from typing import Any

from repro.report import JsonReport

RECIPES = ("allgather", "own_share")
STAGES = (2, 3)
EXPECTATIONS = ("fixed", "buggy")

# (recipe, stage, expect) -> the ratio as a power of sp: sp**k.
_EXPONENT = {
    ("allgather", 2, "buggy"): 1, ("allgather", 2, "fixed"): 1,
    ("allgather", 3, "buggy"): 0, ("allgather", 3, "fixed"): 1,
    ("own_share", 2, "buggy"): 0, ("own_share", 2, "fixed"): 0,
    ("own_share", 3, "buggy"): -1, ("own_share", 3, "fixed"): 0,
}


def expected_ratio(recipe: str, stage: int, sp: int, expect: str) -> float:
    """The sp-gradient / baseline ratio the expectation predicts."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    if stage not in STAGES:
        raise ValueError(f"stage {stage} is not checked; known: {STAGES}")
    if expect not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expect!r}")
    if sp < 1:
        raise ValueError(f"sp must be >= 1, got {sp}")
    return float(Fraction(sp)**_EXPONENT[(recipe, stage, expect)])


def scale_label(value: float, sp: int, rel_tol: float = 1e-3) -> str:
    """'1.0', 'sp', '1/sp' (with sp written out) or the number."""
    for label, target in (("1.0", 1.0), (f"{sp}", float(sp)), (f"1/{sp}", 1.0 / sp)):
        if math.isclose(value, target, rel_tol=rel_tol):
            return label
    return f"{value:.4g}"


# ----------------------------------------------------------------------------- tolerances
#
# Both sides are fp32 on CPU, from the same fp32 weights. They differ only by rounding: the
# sp run computes attention after an all-to-all of the same q/k/v, its loss as a token-weighted
# sum of shard means, and its gradient as a sum over sp ranks (and mean over dp) in fp32,
# where the baseline does one forward/backward over the whole sequence. Measured on 0.19.8
# and master with the fix (sp=2; 2 and 4 ranks): best-fit residual <= 3.3e-7, elementwise error
# <= 1.7e-7 of the largest entry, |ratio / expected - 1| <= 3.1e-8: a few fp32 ulps. The
# tolerances below (1e-4) sit > 500x above that noise and 10^4x below the smallest difference
# this check exists to see (a factor sp >= 2, i.e. 100% of the gradient). The elementwise
# absolute tolerance is relative to the gradient's largest entry, because the tiny model's
# gradients are small (layer 0 q_proj: largest entry 2.2e-4, norm 8.4e-4): a fixed atol such
# as DeepSpeed's ZeRO-2 atol=1e-3 exceeds the largest entry and lets a factor 2 through.
RATIO_REL_TOL = 1e-4  # |ratio / target - 1|
RESIDUAL_TOL = 1e-4  # ||observed - ratio * expected|| / ||expected||: the direction agrees
ELEMENT_RTOL = 1e-4  # elementwise: |observed - target * expected| <= atol + rtol * |target * expected|
ELEMENT_ATOL_REL = 1e-4  # atol = this x max|target * expected|
LOSS_REL_TOL = 1e-5  # the sp run's full-sequence loss vs the baseline's


@dataclasses.dataclass(frozen=True)
class Fit:
    """An observed gradient against the baseline: best scalar fit and elementwise check."""

    observed_norm: float
    expected_norm: float
    ratio: float  # <observed, expected> / <expected, expected>
    residual: float  # ||observed - ratio * expected|| / ||expected||
    max_abs_err: float  # max |observed - target * expected|
    max_abs_target: float  # max |target * expected|
    elementwise_ok: bool


def fit(observed, expected, target: float) -> Fit:
    """Compare ``observed`` with ``target * expected`` (float64, on CPU)."""
    import torch

    o = observed.detach().double().flatten().cpu()
    e = expected.detach().double().flatten().cpu()
    e_norm = float(e.norm())
    if e_norm == 0.0:
        raise ValueError("the baseline gradient is zero: the check cannot tell scales apart")
    ratio = float(o.dot(e) / e.dot(e))
    residual = float((o - ratio * e).norm()) / e_norm
    want = target * e
    err = (o - want).abs()
    max_target = float(want.abs().max())
    ok = bool(torch.all(err <= ELEMENT_ATOL_REL * max_target + ELEMENT_RTOL * want.abs()))
    return Fit(float(o.norm()), e_norm, ratio, residual, float(err.max()), max_target, ok)


def row_ok(ratio: float, residual: float, elementwise_ok: bool, target: float) -> bool:
    return (math.isclose(ratio, target, rel_tol=RATIO_REL_TOL) and residual <= RESIDUAL_TOL and elementwise_ok)


# ----------------------------------------------------------------------------- report

SCHEMA = "zero3-sp-gradfix/alst-recipe-report/v1"


@dataclasses.dataclass(frozen=True)
class AlstRow:
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
    label: str  # the ratio in words: "1.0", "2", "1/2", or the number
    target: float  # what --expect predicts
    ok: bool  # the row matches target within the tolerances
    buggy_target: float
    buggy_ok: bool
    fixed_target: float
    fixed_ok: bool


@dataclasses.dataclass
class AlstReport(JsonReport):
    """JSON schema ``zero3-sp-gradfix/alst-recipe-report/v1`` (one object):

    schema, script                    str
    deepspeed_version, torch_version, transformers_version, python_version   str
    backend ("gloo"|"nccl"), device ("cpu"|"cuda"), launcher ("local"|"external")  str
    world_size, sp, dp                int
    expect                            str   "fixed" | "buggy"
    rows                              list  AlstRow objects (fields as in the dataclass)
    losses                            list  per (recipe, stage): {"recipe", "stage",
                                            "sp_loss", "baseline_loss", "rel_diff", "ok"}:
                                            the full-sequence loss of dp group 0 as the sp run
                                            reports it, and the baseline's
    tolerances                        dict  the tolerances used (see this module)
    extra                             dict  model and sample facts
    holds                             bool  every row ok and every loss ok
    pattern                           str   "fixed" | "buggy" | "other": which table the rows match
    exit_code                         int   0 holds, 1 does not
    wall_time_s                       float|null
    """

    script: str
    deepspeed_version: str
    torch_version: str
    transformers_version: str
    backend: str
    device: str
    launcher: str
    world_size: int
    sp: int
    dp: int
    expect: str
    rows: list[AlstRow]
    losses: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tolerances: dict[str, float] = dataclasses.field(default_factory=lambda: dict(TOLERANCES))
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    python_version: str = dataclasses.field(default_factory=platform.python_version)
    wall_time_s: float | None = None
    schema: str = SCHEMA

    @property
    def holds(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows) and all(x["ok"] for x in self.losses)

    @property
    def pattern(self) -> str:
        return pattern_of(self.rows)

    @property
    def exit_code(self) -> int:
        return 0 if self.holds else 1

    SCHEMA = SCHEMA

    @classmethod
    def _nested(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**kwargs, "rows": [AlstRow(**r) for r in kwargs["rows"]]}


TOLERANCES = {
    "ratio_rel_tol": RATIO_REL_TOL,
    "residual_tol": RESIDUAL_TOL,
    "element_rtol": ELEMENT_RTOL,
    "element_atol_rel": ELEMENT_ATOL_REL,
    "loss_rel_tol": LOSS_REL_TOL,
}


def pattern_of(rows: list[AlstRow]) -> str:
    """'fixed' or 'buggy' when every row matches that table (they differ for ZeRO-3), else 'other'."""
    if rows and all(r.fixed_ok for r in rows):
        return "fixed"
    if rows and all(r.buggy_ok for r in rows):
        return "buggy"
    return "other"


def loss_entry(recipe: str, stage: int, sp_loss: float, baseline_loss: float) -> dict[str, Any]:
    rel = abs(sp_loss - baseline_loss) / max(abs(baseline_loss), 1e-30)
    return {"recipe": recipe, "stage": stage, "sp_loss": sp_loss, "baseline_loss": baseline_loss,
            "rel_diff": rel, "ok": rel <= LOSS_REL_TOL}


def make_row(recipe: str, stage: int, param: str, observed, expected, sp: int, expect: str, path: str) -> AlstRow:
    target = expected_ratio(recipe, stage, sp, expect)
    buggy_target = expected_ratio(recipe, stage, sp, "buggy")
    fixed_target = expected_ratio(recipe, stage, sp, "fixed")
    fits = {t: fit(observed, expected, t) for t in {target, buggy_target, fixed_target}}
    f = fits[target]

    def ok(t: float) -> bool:
        return row_ok(fits[t].ratio, fits[t].residual, fits[t].elementwise_ok, t)

    return AlstRow(recipe=recipe, stage=stage, param=param, numel=int(expected.numel()), path=path,
                   observed_norm=f.observed_norm, expected_norm=f.expected_norm, ratio=f.ratio, residual=f.residual,
                   max_abs_err=f.max_abs_err, max_abs_expected=float(expected.detach().abs().max()),
                   label=scale_label(f.ratio, sp), target=target, ok=ok(target),
                   buggy_target=buggy_target, buggy_ok=ok(buggy_target), fixed_target=fixed_target,
                   fixed_ok=ok(fixed_target))


def render_table(report: AlstReport) -> str:
    sp = report.sp
    header = ("recipe", "stage", "param", "path", "ratio", "expect", "residual", "verdict")
    lines = [(r.recipe, f"zero{r.stage}", r.param, r.path, f"{r.ratio:.6f} ({r.label})", scale_label(r.target, sp),
              f"{r.residual:.1e}", "ok" if r.ok else "MISMATCH") for r in report.rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    if report.losses:
        out.append("")
        for x in report.losses:
            out.append(f"loss {x['recipe']:<9} zero{x['stage']}: sp {x['sp_loss']:.7f}  baseline "
                       f"{x['baseline_loss']:.7f}  rel diff {x['rel_diff']:.1e}  {'ok' if x['ok'] else 'MISMATCH'}")
    summary = (f"{report.script}: DeepSpeed {report.deepspeed_version}, torch {report.torch_version}, "
               f"transformers {report.transformers_version}, {report.backend}, world {report.world_size} "
               f"(sp={report.sp}, dp={report.dp}), --expect {report.expect}: "
               f"{'HOLDS' if report.holds else 'DOES NOT HOLD'} (pattern seen: {report.pattern})")
    if report.wall_time_s is not None:
        summary += f", {report.wall_time_s:.1f} s"
    return "\n".join(out + ["", summary])


def emit(report_dict: dict[str, Any], wall_time_s: float, json_path: Path | None) -> None:
    """The launch's report sink: add the wall time, print the table, write --json."""
    report = AlstReport.from_dict(report_dict)
    report.wall_time_s = round(wall_time_s, 3)
    print(render_table(report), flush=True)
    if json_path is not None:
        report.write(json_path)
