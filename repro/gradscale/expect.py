"""The expectation of the gradient-scale reproducers: pure logic, no DeepSpeed.

Each measured gradient is compared with ``scale * expected``, where the scale is what the
expectation predicts for the path the gradient took, by the one rule of
``repro.harness.scales.expected_scale`` (recipe "none": the probe backprops each rank's own loss):

* ``--expect fixed``: 1 everywhere.
* ``--expect buggy``: the known unpatched pattern: 1/sp for a gradient that went through
  ZeRO-3's ``__avg_scatter_grads`` when sp > 1, 1 for every other one.

The fit of an observed gradient to the expected one is ``scales.fit`` and its label
``scales.label``; what this module adds is the elementwise check of a row, with the fp32
tolerances of the probe.
"""

from __future__ import annotations

import torch

# Tolerances for fp32 gradients of O(1) entries summed over at most 4 ranks.
FP32_RTOL = 1e-5
FP32_ATOL = 1e-6


def matches(observed: torch.Tensor, expected: torch.Tensor, scale: float, rtol: float = FP32_RTOL,
            atol: float = FP32_ATOL) -> bool:
    """Elementwise: observed == scale * expected within tolerance."""
    target = expected.detach().double().cpu() * scale
    return bool(torch.allclose(observed.detach().double().cpu(), target, rtol=rtol, atol=atol))
