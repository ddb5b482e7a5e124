"""The ALST recipe check's expectation: the tolerances, the fit of a gradient, the per-row verdict. Pure logic.

The expected ratio is ``repro.harness.scales``' rule (docs/alst-recipe.md has its table).
"""

from __future__ import annotations

import dataclasses
import math

from repro.harness import scales

# Both sides are fp32 from the same weights and differ by rounding only: measured (0.19.8, master + fix) noise is
# a few ulps (residual <= 3.3e-7), 1e-4 sits > 500x above it and 10^4x below a factor sp. The elementwise atol is
# relative to the largest entry: the tiny model's gradients are ~1e-4, so a fixed atol=1e-3 lets a factor 2 through.
RATIO_REL_TOL = 1e-4  # |ratio / target - 1|
RESIDUAL_TOL = 1e-4  # ||observed - ratio * expected|| / ||expected||: the direction agrees
ELEMENT_RTOL = 1e-4  # elementwise: |observed - target * expected| <= atol + rtol * |target * expected|
ELEMENT_ATOL_REL = 1e-4  # atol = this x max|target * expected|
LOSS_REL_TOL = 1e-5  # the sp run's full-sequence loss vs the baseline's

TOLERANCES = dict(ratio_rel_tol=RATIO_REL_TOL, residual_tol=RESIDUAL_TOL, element_rtol=ELEMENT_RTOL,
                  element_atol_rel=ELEMENT_ATOL_REL, loss_rel_tol=LOSS_REL_TOL)


@dataclasses.dataclass(frozen=True)
class Fit:
    """An observed gradient against ``target`` x the baseline: ``scales.fit``'s scalar fit, the elementwise check."""

    scalar: scales.Fit  # ratio = <observed, expected> / <expected, expected>, residual
    target: float
    max_abs_err: float  # max |observed - target * expected|
    max_abs_target: float  # max |target * expected|
    elementwise_ok: bool

    @property
    def ok(self) -> bool:
        """The gradient is ``target`` x the baseline within the tolerances."""
        return row_ok(self.scalar.ratio, self.scalar.residual, self.elementwise_ok, self.target)


def fit(observed, expected, target: float, scalar: scales.Fit | None = None) -> Fit:
    """Compare ``observed`` with ``target * expected`` (float64, on CPU); ``scalar``: ``scales.fit``'s, if known."""
    import torch

    scalar = scales.fit(observed, expected) if scalar is None else scalar
    o = observed.detach().double().flatten().cpu()
    want = target * expected.detach().double().flatten().cpu()
    err = (o - want).abs()
    max_target = float(want.abs().max())
    ok = bool(torch.all(err <= ELEMENT_ATOL_REL * max_target + ELEMENT_RTOL * want.abs()))
    return Fit(scalar, target, float(err.max()), max_target, ok)


def row_ok(ratio: float, residual: float, elementwise_ok: bool, target: float) -> bool:
    return (math.isclose(ratio, target, rel_tol=RATIO_REL_TOL) and residual <= RESIDUAL_TOL and elementwise_ok)


def loss_ok(rel_diff: float) -> bool:
    """The sp run's full-sequence loss agrees with the baseline's."""
    return rel_diff <= LOSS_REL_TOL
