"""Scales and ratios, for every family: the one rule (observed / true gradient = the loss recipe's factor ``m``
x DeepSpeed's factor ``r``), the one fit and the one label. Pure logic."""

from __future__ import annotations

import dataclasses
import enum
import math
from fractions import Fraction

EXPECTATIONS = ("fixed", "buggy")
LOSS_RECIPES = ("allgather", "own_share")  # what sp loss code backprops (docs/alst-recipe.md describes them)
RECIPES = ("none", *LOSS_RECIPES)  # "none": a plain loss, no sp loss code
LABEL_TOL = 1e-3  # the default tolerance of ``label``: norm-wise relative error
MAX_DENOMINATOR = 64
# Every family's tolerances, one table; reports record their family's. What each value sits above:
TOLERANCES: dict[str, dict[str, float]] = {
    # elementwise, fp32: observed == scale x oracle
    "gradscale": dict(rtol=1e-5, atol=1e-6),
    # norm-wise relative error at scale x oracle, per dtype: above the <= 10 unit roundoffs a gradient's arithmetic
    # adds (docs/parity-audit.md, "Judging")
    "audit": dict(fp32=1e-5, bf16=5e-2),
    # fp32 both sides, rounding only: measured noise a few ulps (residual <= 3.3e-7); 1e-4 is > 500x above it and
    # 10^4x below a factor sp. atol = element_atol_rel x the largest entry: the tiny model's gradients are ~1e-4,
    # so a fixed atol=1e-3 lets a factor 2 through
    "alst": dict(ratio_rel_tol=1e-4, residual_tol=1e-4, element_rtol=1e-4, element_atol_rel=1e-4, loss_rel_tol=1e-5),
    # measured drift from the reference over 30 steps (docs/downstream-notice.md): <= 1.6% in gradient norm, 8.9e-4
    # in loss; step 0 has no drift yet, only the ALST check's rounding
    "training": dict(grad_norm_rel_tol=5e-2, step0_rel_tol=1e-4, loss_rel_tol=5e-3),
}


class ReducePath(str, enum.Enum):
    """Where DeepSpeed reduced a parameter's gradient."""

    AVG_SCATTER = "__avg_scatter_grads"
    CONTIGUOUS = "__avg_scatter_contiguous_grads"
    STAGE_1_2 = "stage_1_and_2"
    STAGE_0 = "engine.allreduce_gradients"

    def __str__(self) -> str:
        return self.value


def default_path(stage: int) -> ReducePath:
    """The path a stage's default config takes (ZeRO-3: ``__avg_scatter_grads``)."""
    return {0: ReducePath.STAGE_0, 1: ReducePath.STAGE_1_2, 2: ReducePath.STAGE_1_2, 3: ReducePath.AVG_SCATTER}[stage]


def deepspeed_factor(path: ReducePath | str, sp: int, expect: str) -> Fraction:
    """``r`` of the rule: DeepSpeed's reduced gradient over the sum of the sp ranks' local gradients."""
    if expect not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expect!r}")
    if sp < 1:
        raise ValueError(f"sp must be >= 1, got {sp}")
    return Fraction(1, sp) if expect == "buggy" and ReducePath(path) is ReducePath.AVG_SCATTER else Fraction(1)


def bug_scales(path: ReducePath | str, sp: int) -> bool:
    """Whether the unpatched code scales a gradient on ``path`` at this sp (by 1/sp): ``r`` != 1 for ``buggy``."""
    return deepspeed_factor(path, sp, "buggy") != 1


def recipe_factor(recipe: str, sp: int, compensates: bool = False, divides_by_sp: bool = False) -> Fraction:
    """``m`` of the rule: the sum over the sp ranks of what they backprop, over the true loss."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    if sp < 1:
        raise ValueError(f"sp must be >= 1, got {sp}")
    m = Fraction(sp) if recipe == "allgather" or (recipe == "own_share" and compensates) else Fraction(1)
    return m / sp if divides_by_sp else m


def expected_scale(path: ReducePath | str, sp: int, expect: str, recipe: str = "none", compensates: bool = False,
                   divides_by_sp: bool = False) -> float:
    """The rule: the scale of the gradient over the true gradient (``m`` x ``r``)."""
    return float(recipe_factor(recipe, sp, compensates, divides_by_sp) * deepspeed_factor(path, sp, expect))


@dataclasses.dataclass(frozen=True)
class Fit:
    """``observed`` against ``expected``: the best scalar fit and what is left over."""

    observed_norm: float
    expected_norm: float
    ratio: float  # <observed, expected> / <expected, expected>
    residual: float  # ||observed - ratio * expected|| / ||expected||: 0 when they are parallel


def fit(observed, expected) -> Fit:
    """The best scalar fit of ``observed`` to ``expected`` (float64, on CPU)."""
    o, e = (t.detach().double().flatten().cpu() for t in (observed, expected))
    e_norm = float(e.norm())
    if e_norm == 0.0:
        raise ValueError("the expected gradient is zero: the check cannot tell scales apart")
    ratio = float(o.dot(e) / e.dot(e))
    return Fit(float(o.norm()), e_norm, ratio, float((o - ratio * e).norm()) / e_norm)


def error_at(ratio: float, residual: float, scale: float) -> float:
    """Norm-wise relative error of the observed gradient against ``scale`` x the expected one."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    return math.hypot(residual, ratio - scale) / scale


def label(ratio: float, residual: float = 0.0, tol: float = LABEL_TOL) -> str:
    """The simple fraction the ratio is at ("1", "1/2", "2", "3/2") within ``tol``, else "other"."""
    if not ratio > 0 or math.isinf(ratio):
        return "other"
    frac = Fraction(ratio).limit_denominator(MAX_DENOMINATOR)
    return str(frac) if frac > 0 and error_at(ratio, residual, float(frac)) <= tol else "other"
