"""The expected full gradient, from the ranks' local gradients, in plain torch: summed over the sp ranks,
averaged over the dp ranks (DeepSpeed's convention, #4530, #5555)."""

from __future__ import annotations

from typing import Sequence

import torch

from repro.gradscale.model import local_gradients
from repro.gradscale.space import ParamSpec
from repro.harness.topology import Topology


def expected_gradient(local: Sequence[torch.Tensor], topology: Topology) -> torch.Tensor:
    """sum over each sp group, then mean over the dp groups; ``local[r]`` is rank r's gradient."""
    if len(local) != topology.world_size:
        raise ValueError(f"need {topology.world_size} local gradients, got {len(local)}")
    per_sp_group = [torch.stack([local[r] for r in block]).sum(0) for block in topology.sp_groups()]
    return torch.stack(per_sp_group).mean(0)


def expected_gradients(specs: tuple[ParamSpec, ...], topology: Topology, micro_steps: int = 1,
                       model_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every parameter's expected full gradient (float64), computed by every rank alike; with ``micro_steps`` > 1
    the mean over micro-steps (DeepSpeed scales each one's loss by 1/micro_steps)."""
    if micro_steps < 1:
        raise ValueError(f"micro_steps must be >= 1, got {micro_steps}")
    per_step = []
    for m in range(micro_steps):
        local = [local_gradients(specs, r, micro_step=m, model_dtype=model_dtype) for r in range(topology.world_size)]
        per_step.append({s.name: expected_gradient([g[s.name] for g in local], topology) for s in specs})
    if micro_steps == 1:
        return per_step[0]
    return {s.name: torch.stack([step[s.name] for step in per_step]).mean(0) for s in specs}
