"""Run one ZeRO configuration through a real DeepSpeed engine and read back full gradients.

One engine per configuration: build the probe model, ``deepspeed.initialize`` it with the sp
mpu, one forward/backward on this rank's inputs, read every parameter's full (reduced)
gradient with ``safe_get_full_grad`` (a collective under ZeRO-3: every rank calls it), and
note which reduction each gradient went through, by watching ZeRO-3's two reduce methods
(calls pass straight through; nothing is changed). The engine is destroyed before the next.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import torch

from repro.model import ParamSpec, ProbeModel, rank_inputs
from repro.harness.engine import destroy_engine, ds_config, watch_reduce_paths
from repro.harness.scales import ReducePath


@dataclasses.dataclass(frozen=True)
class ZeroConfig:
    stage: int
    reduce_scatter: bool | None = None
    contiguous_gradients: bool | None = None
    reduce_bucket_size: int | None = None

    def label(self) -> str:
        knobs = [f"rs={self.reduce_scatter}" if self.reduce_scatter is not None else "",
                 f"cg={self.contiguous_gradients}" if self.contiguous_gradients is not None else "",
                 f"bucket={self.reduce_bucket_size}" if self.reduce_bucket_size is not None else ""]
        return " ".join([f"zero{self.stage}"] + [k for k in knobs if k])

    def zero_section(self) -> dict[str, Any]:
        section: dict[str, Any] = {"stage": self.stage}
        for key in ("reduce_scatter", "contiguous_gradients", "reduce_bucket_size"):
            if getattr(self, key) is not None:
                section[key] = getattr(self, key)
        return section


# The four ZeRO-3 configurations (reduce_scatter, contiguous_gradients, bucket):
# (False, True, 500) takes the contiguous path; (False, False, 500) and (True, True, 500)
# take __avg_scatter_grads; (False, True, 16) splits: small params contiguous, large not.
ZERO3_CONFIGS = (
    ZeroConfig(3, False, True, 500),
    ZeroConfig(3, False, False, 500),
    ZeroConfig(3, True, True, 500),
    ZeroConfig(3, False, True, 16),
)
REFERENCE_CONFIGS = (ZeroConfig(1), ZeroConfig(2))


@dataclasses.dataclass
class Measured:
    name: str
    numel: int
    full_grad: torch.Tensor
    path: ReducePath


def run_config(zero: ZeroConfig, specs: tuple[ParamSpec, ...], rank: int, device: str, mpu,
               config_overrides: dict[str, Any] | None = None) -> list[Measured]:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    model = ProbeModel(specs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu,
                                      config=ds_config(zero, **(config_overrides or {})))
    try:
        paths = watch_reduce_paths(engine.optimizer) if zero.stage == 3 else None
        loss = engine(*rank_inputs(specs, rank, device=device))
        engine.backward(loss)
        named = dict(engine.module.named_parameters())
        measured = []
        for spec in specs:
            param = named[f"weights.{spec.name}"]
            grad = safe_get_full_grad(param)  # collective under ZeRO-3: same order on every rank
            if grad is None:
                raise RuntimeError(f"{zero.label()}: DeepSpeed returned no gradient for {spec.name}")
            measured.append(Measured(spec.name, spec.numel, grad.detach().float().cpu().clone(),
                                     _path_of(param, paths, zero)))
        return measured
    finally:
        destroy_engine(engine)
        del engine, optimizer, model
        gc.collect()


def _path_of(param, paths: dict[int, ReducePath] | None, zero: ZeroConfig) -> ReducePath:
    if zero.stage == 0:
        return ReducePath.STAGE_0
    if zero.stage in (1, 2):
        return ReducePath.STAGE_1_2
    if id(param) not in paths:
        raise RuntimeError(f"{zero.label()}: the gradient of a parameter went through neither ZeRO-3 reduce path")
    return paths[id(param)]
