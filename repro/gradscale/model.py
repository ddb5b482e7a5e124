"""The probe model, each rank's inputs and the oracle (sum over the sp ranks, mean over the dp ranks: DeepSpeed's
convention, #4530, #5555): plain torch."""

from __future__ import annotations

from typing import Sequence

import torch

from repro.gradscale.space import ParamSpec
from repro.harness.topology import Topology

_INIT_SEED = 20260917
_INPUT_SEED = 8692  # the upstream report's issue number; any fixed value works


class ProbeModel(torch.nn.Module):
    """Independent 1-D parameters, loss = sum_p 0.5 * ||p * x_p||^2, so dL/dp = p * x_p^2: ranks' local gradients
    differ in direction and size, so a missing, doubled or 1/sp-scaled reduction each shows."""

    def __init__(self, specs: tuple[ParamSpec, ...]):
        super().__init__()
        gen = torch.Generator().manual_seed(_INIT_SEED)
        self.specs = specs
        self.weights = torch.nn.ParameterDict(
            {s.name: torch.nn.Parameter(torch.randn(s.numel, generator=gen) + 2.0)
             for s in specs})

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        weights = [self.weights[spec.name] for spec in self.specs]
        return sum(0.5 * (w * x.to(w.dtype)).pow(2).sum() for w, x in zip(weights, inputs))


# Micro-step m > 0 draws from its own stream; micro-step 0 keeps the single-step reproducers' seed.
_MICRO_STEP_STRIDE = 1_000_003


def rank_inputs(specs: tuple[ParamSpec, ...], rank: int, dtype=torch.float32, device="cpu",
                micro_step: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(_INPUT_SEED * 1000 + rank + _MICRO_STEP_STRIDE * micro_step)
    return tuple(
        torch.randn(s.numel, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device) for s in specs)


def local_gradients(specs: tuple[ParamSpec, ...], rank: int, micro_step: int = 0,
                    model_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s own gradient, in float64 plain torch; ``model_dtype``: weights and inputs first rounded to
    the engine's dtype (the oracle then sees the engine's operands), ``None`` keeps them float64."""
    model = ProbeModel(specs)
    inputs = rank_inputs(specs, rank, dtype=torch.float64, micro_step=micro_step)
    if model_dtype is not None:
        model = model.to(model_dtype)
        inputs = tuple(x.to(model_dtype) for x in inputs)
    model = model.double()
    model(*(x.double() for x in inputs)).backward()
    return {s.name: model.weights[s.name].grad.detach().clone() for s in specs}


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
    return {s.name: torch.stack([step[s.name] for step in per_step]).mean(0) for s in specs}
