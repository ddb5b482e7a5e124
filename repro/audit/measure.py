"""Run one audit point through a real DeepSpeed engine; observe, change nothing.

Per point: a fresh probe model, ``deepspeed.initialize`` with the point's config and the sp
mpu, ``gas`` micro-steps (forward, ``engine.backward``, and ``engine.step()`` between
micro-steps so the engine counts them; the last backward is the accumulation boundary), then
every parameter's full gradient via ``safe_get_full_grad`` (a collective under ZeRO-3), read
at the boundary before any optimizer step. The engine is destroyed before the next point.

Which code reduced the gradients is observed, not predicted, by wrapping methods on this
engine's instances only (the calls pass straight through):

* ZeRO-3: per parameter, ``__avg_scatter_grads`` or ``__avg_scatter_contiguous_grads``
  (``repro.harness.engine.watch_reduce_paths``).
* ZeRO-1/2: which of ``gradient_reduction_w_predivide`` (average_tensor without
  reduce_scatter), ``average_tensor`` with reduce_scatter, ``buffered_reduce_fallback``
  (contiguous_gradients=False) ran. All parameters of a point take the same one.
* ZeRO-0: ``engine.allreduce_bucket``.

A point DeepSpeed refuses while building the engine (AssertionError, ValueError,
NotImplementedError, a config validation error: its own checks) is "rejected"; any other
exception is an "error".
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import torch

from repro.audit.space import AuditPoint
from repro.gradscale.model import ProbeModel, rank_inputs
from repro.gradscale.space import ParamSpec
from repro.harness.engine import destroy_engine, ds_config, full_gradients, watch_reduce_paths

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Exception types DeepSpeed uses for "this configuration is not supported" while it builds an
# engine; pydantic's ValidationError is a ValueError subclass.
REJECTION_TYPES = (AssertionError, ValueError, NotImplementedError)

STAGE_1_2_METHODS = ("gradient_reduction_w_predivide", "average_tensor", "buffered_reduce_fallback")
STAGE_0_PATH = "engine.allreduce_bucket"


@dataclasses.dataclass
class MeasuredGrad:
    name: str
    numel: int
    full_grad: torch.Tensor  # float64, cpu
    path: str  # the code path that reduced it (observed)
    dtype: str  # dtype DeepSpeed returned it in


@dataclasses.dataclass
class PointOutcome:
    status: str  # "ran" | "rejected" | "error"
    message: str = ""
    optimizer: str = ""
    grads: list[MeasuredGrad] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def run_point(point: AuditPoint, specs: tuple[ParamSpec, ...], rank: int, device: str, mpu) -> PointOutcome:
    import deepspeed

    start = time.monotonic()
    model = ProbeModel(specs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    config = ds_config_for(point)
    try:
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu, config=config)
    except REJECTION_TYPES as exc:
        outcome = PointOutcome("rejected", _one_line(exc))
    except Exception as exc:  # noqa: BLE001 - reported per point, the audit goes on
        outcome = PointOutcome("error", f"deepspeed.initialize: {_one_line(exc)}")
    else:
        outcome = None
    if outcome is not None:
        del optimizer, model
        settle_heap()
        outcome.seconds = time.monotonic() - start
        return outcome
    try:
        outcome = _measure(engine, point, specs, rank, device)
    except Exception as exc:  # noqa: BLE001
        outcome = PointOutcome("error", _one_line(exc))
    finally:
        try:
            destroy_engine(engine)
        finally:
            del engine, optimizer, model
    settle_heap()
    outcome.seconds = time.monotonic() - start
    return outcome


def settle_heap() -> None:
    """Collect this point's garbage, then freeze what survives (``gc.freeze``).

    DeepSpeed calls ``gc.collect()`` while it builds a ZeRO-3 engine (``zero.utils.defragment``)
    and in ``destroy()``. With torch and DeepSpeed imported, one full collection takes
    0.5-0.8 s here; frozen objects are skipped, so after the first point a collection costs
    milliseconds (measured: 1.3 s -> 0.1 s per single-rank ZeRO-3 point). Only objects that
    survived a full collection are frozen, i.e. reachable ones; later points' objects are
    collected as usual. No gradient, no DeepSpeed code path changes.
    """
    gc.collect()
    gc.freeze()


def ds_config_for(point: AuditPoint) -> dict[str, Any]:
    return ds_config(point.zero_section(), **point.config_overrides())


def _measure(engine, point: AuditPoint, specs, rank: int, device: str) -> PointOutcome:

    optimizer_name = type(engine.optimizer).__name__
    z3_paths = watch_reduce_paths(engine.optimizer) if point.stage == 3 else None
    calls: list[str] = []
    if point.stage in (1, 2):
        _watch_methods(engine.optimizer, STAGE_1_2_METHODS, calls)
    elif point.stage == 0:
        _watch_methods(engine, ("allreduce_bucket", ), calls)

    for micro in range(point.gas):
        loss = engine(*rank_inputs(specs, rank, device=device, micro_step=micro))
        engine.backward(loss)
        if micro < point.gas - 1:
            engine.step()  # not a boundary: the engine only counts the micro-step
    grads = [
        MeasuredGrad(spec.name, spec.numel,
                     grad.detach().double().cpu().clone(), _path(point, param, z3_paths, calls),
                     str(grad.dtype).replace("torch.", ""))
        for spec, (_, param, grad) in zip(specs, full_gradients(engine, [f"weights.{s.name}" for s in specs]))
    ]
    return PointOutcome("ran", optimizer=optimizer_name, grads=grads)


def _path(point: AuditPoint, param, z3_paths, calls: list[str]) -> str:
    if point.stage == 3:
        if id(param) not in z3_paths:
            raise RuntimeError("a gradient went through neither ZeRO-3 reduce path")
        return str(z3_paths[id(param)])
    if point.stage == 0:
        return STAGE_0_PATH if calls else "engine (no allreduce_bucket call)"
    if "gradient_reduction_w_predivide" in calls:
        return "stage_1_and_2.gradient_reduction_w_predivide"
    if "average_tensor" in calls:
        return "stage_1_and_2.average_tensor[reduce_scatter]"
    if "buffered_reduce_fallback" in calls:
        return "stage_1_and_2.buffered_reduce_fallback"
    return "stage_1_and_2 (no reduce method observed)"


def _watch_methods(obj, names, calls: list[str]) -> None:
    """Record calls of ``obj``'s own methods by name; an instance attribute shadows the class's."""
    for name in names:
        original = getattr(type(obj), name, None)
        if original is None:
            continue

        def wrapper(*args, __name=name, __original=original, **kwargs):
            calls.append(__name)
            return __original(obj, *args, **kwargs)

        setattr(obj, name, wrapper)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
