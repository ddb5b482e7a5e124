"""The ALST recipe check's space (the loss recipes of docs/alst-recipe.md, ZeRO-2 and -3 on their default configs)
and expectation: the fit of a gradient and the per-row verdict, at ``scales.TOLERANCES["alst"]``. Pure logic."""

from __future__ import annotations

import dataclasses
import math

from repro.harness import scales

RECIPES = scales.LOSS_RECIPES
# The allgather recipe's differentiable all_gather: what the ALST check calls, what classify() finds in a client.
TORCH_ALL_GATHER = "torch.distributed.nn.functional.all_gather"
STAGES = (2, 3)
TOLERANCES = scales.TOLERANCES["alst"]


@dataclasses.dataclass(frozen=True)
class Fit:
    """An observed gradient against ``target`` x the baseline: ``scales.fit``'s scalar fit, the elementwise check."""

    scalar: scales.Fit  # ratio = <observed, expected> / <expected, expected>, residual
    target: float
    max_abs_err: float  # max |observed - target * expected|
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
    ok = bool(torch.all(err <= TOLERANCES["element_atol_rel"] * max_target + TOLERANCES["element_rtol"] * want.abs()))
    return Fit(scalar, target, float(err.max()), ok)


def row_ok(ratio: float, residual: float, elementwise_ok: bool, target: float) -> bool:
    return (math.isclose(ratio, target, rel_tol=TOLERANCES["ratio_rel_tol"]) and residual <= TOLERANCES["residual_tol"]
            and elementwise_ok)


def loss_ok(rel_diff: float) -> bool:
    """The sp run's full-sequence loss agrees with the baseline's."""
    return rel_diff <= TOLERANCES["loss_rel_tol"]
