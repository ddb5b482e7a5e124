"""The probe model and each rank's inputs: plain torch, shared by DeepSpeed runs and the oracle."""

from __future__ import annotations

import dataclasses

import torch

_INIT_SEED = 20260917
_INPUT_SEED = 8692  # the upstream report's issue number; any fixed value works


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int


# The issue report's shape: a parameter that fits a small reduce bucket and one that does not.
SMALL_AND_LARGE = (ParamSpec("small", 4), ParamSpec("large", 64))


class ProbeModel(torch.nn.Module):
    """Independent 1-D parameters, loss = sum_p 0.5 * ||p * x_p||^2, so dL/dp = p * x_p^2.

    The gradient depends on both the weights and the rank's input, so ranks' local
    gradients differ in direction as well as size: a missing reduction, a doubled one or a
    1/sp scale each give a distinct, detectable result.
    """

    def __init__(self, specs: tuple[ParamSpec, ...]):
        super().__init__()
        gen = torch.Generator().manual_seed(_INIT_SEED)
        self.specs = specs
        self.weights = torch.nn.ParameterDict(
            {s.name: torch.nn.Parameter(torch.randn(s.numel, generator=gen) + 2.0) for s in specs})

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        loss = None
        for spec, x in zip(self.specs, inputs):
            term = 0.5 * (self.weights[spec.name] * x.to(self.weights[spec.name].dtype)).pow(2).sum()
            loss = term if loss is None else loss + term
        return loss


def rank_inputs(specs: tuple[ParamSpec, ...], rank: int, dtype=torch.float32, device="cpu") -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(_INPUT_SEED * 1000 + rank)
    return tuple(torch.randn(s.numel, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
                 for s in specs)


def local_gradients(specs: tuple[ParamSpec, ...], rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s own gradient, in float64 plain torch: no DeepSpeed, no collectives."""
    model = ProbeModel(specs).double()
    model(*rank_inputs(specs, rank, dtype=torch.float64)).backward()
    return {s.name: model.weights[s.name].grad.detach().clone() for s in specs}
