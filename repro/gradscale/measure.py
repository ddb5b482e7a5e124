"""Run one ZeRO configuration through a real DeepSpeed engine (one forward/backward on this rank's inputs) and
read back every parameter's full gradient and the reduce path it took."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import torch

from repro.gradscale.model import ProbeModel, rank_inputs
from repro.gradscale.space import ParamSpec, ZeroConfig
from repro.harness.engine import destroy_engine, ds_config, full_gradients, watch_reduce_paths
from repro.harness.scales import ReducePath, default_path


@dataclasses.dataclass
class Measured:
    name: str
    numel: int
    full_grad: torch.Tensor
    path: ReducePath


def run_config(zero: ZeroConfig, specs: tuple[ParamSpec, ...], rank: int, device: str, mpu,
               config_overrides: dict[str, Any] | None = None) -> list[Measured]:
    import deepspeed

    model = ProbeModel(specs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu,
                                      config=ds_config(zero, **(config_overrides or {})))
    try:
        paths = watch_reduce_paths(engine.optimizer) if zero.stage == 3 else None
        loss = engine(*rank_inputs(specs, rank, device=device))
        engine.backward(loss)
        grads = full_gradients(engine, [f"weights.{spec.name}" for spec in specs], f"{zero.label()}: ")
        return [
            Measured(spec.name, spec.numel,
                     grad.detach().float().cpu().clone(), path_of(param, paths, zero))
            for spec, (_, param, grad) in zip(specs, grads)
        ]
    finally:
        destroy_engine(engine)
        del engine, optimizer, model
        gc.collect()


def path_of(param, paths: dict[int, ReducePath] | None, zero: ZeroConfig) -> ReducePath:
    if zero.stage != 3:
        return default_path(zero.stage)
    if id(param) not in paths:
        raise RuntimeError(f"{zero.label()}: the gradient of a parameter went through neither ZeRO-3 reduce path")
    return paths[id(param)]
