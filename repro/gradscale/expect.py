"""From an observed and an expected gradient to a verdict: pure logic, no DeepSpeed.

Each measured gradient is compared with ``scale * expected``, where the scale is what the
expectation predicts for the path the gradient took:

* ``--expect fixed``: 1.0 everywhere.
* ``--expect buggy``: the known unpatched pattern: 1/sp for a gradient that went through
  ZeRO-3's ``__avg_scatter_grads`` when sp > 1, 1.0 for every other one.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from repro.harness.scales import ReducePath


EXPECTATIONS = ("fixed", "buggy")


def target_scale(path: ReducePath, sp: int, expect: str) -> float:
    if expect not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expect!r}")
    if expect == "buggy" and path is ReducePath.AVG_SCATTER and sp > 1:
        return 1.0 / sp
    return 1.0


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``observed`` against ``expected``: the best scalar fit and what is left over."""

    observed_norm: float
    expected_norm: float
    ratio: float  # <observed, expected> / <expected, expected>
    residual: float  # ||observed - ratio * expected|| / ||expected||: 0 when they are parallel


def compare(observed: torch.Tensor, expected: torch.Tensor) -> Comparison:
    o = observed.detach().double().flatten().cpu()
    e = expected.detach().double().flatten().cpu()
    e_norm = float(e.norm())
    if e_norm == 0.0:
        raise ValueError("the expected gradient is zero: the probe cannot tell scales apart")
    ratio = float(o.dot(e) / e.dot(e))
    residual = float((o - ratio * e).norm()) / e_norm
    return Comparison(float(o.norm()), e_norm, ratio, residual)


# Tolerances for fp32 gradients of O(1) entries summed over at most 4 ranks.
FP32_RTOL = 1e-5
FP32_ATOL = 1e-6


def matches(observed: torch.Tensor, expected: torch.Tensor, scale: float, rtol: float = FP32_RTOL,
            atol: float = FP32_ATOL) -> bool:
    """Elementwise: observed == scale * expected within tolerance."""
    target = expected.detach().double().cpu() * scale
    return bool(torch.allclose(observed.detach().double().cpu(), target, rtol=rtol, atol=atol))


def classify(ratio: float, residual: float, sp: int, rel_tol: float = 1e-3) -> str:
    """A human label for a ratio: '1.0', '1/sp', 'sp' or 'other'."""
    if residual > rel_tol:
        return "other"
    for label, value in (("1.0", 1.0), (f"1/{sp}", 1.0 / sp), (f"{sp}", float(sp))):
        if math.isclose(ratio, value, rel_tol=rel_tol):
            return label
    return "other"
