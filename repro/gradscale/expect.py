"""The gradient-scale reproducers' elementwise check of a row against ``scale`` x the oracle, at the probe's fp32
tolerances (the scale: ``repro.harness.scales.expected_scale``, recipe "none"). Pure logic, no DeepSpeed."""

from __future__ import annotations

import torch

FP32_RTOL = 1e-5
FP32_ATOL = 1e-6


def matches(observed: torch.Tensor, expected: torch.Tensor, scale: float, rtol: float = FP32_RTOL,
            atol: float = FP32_ATOL) -> bool:
    """Elementwise: observed == scale * expected within tolerance."""
    target = expected.detach().double().cpu() * scale
    return bool(torch.allclose(observed.detach().double().cpu(), target, rtol=rtol, atol=atol))
