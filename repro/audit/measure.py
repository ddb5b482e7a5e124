"""Run one audit point through a real DeepSpeed engine and observe, changing nothing, which code reduced each
gradient; a point DeepSpeed refuses while building the engine is "rejected", any other failure an "error"."""

from __future__ import annotations

import dataclasses
import gc
import time

import torch

from repro.audit.space import AuditPoint
from repro.gradscale.model import ProbeModel, rank_inputs
from repro.gradscale.space import ParamSpec
from repro.harness.engine import destroy_engine, ds_config, full_gradients, spy, watch_reduce_paths

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# DeepSpeed's "not supported" while it builds an engine (pydantic's ValidationError is a ValueError).
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
    config = ds_config(point.zero_section(), **point.config_overrides())
    try:
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu, config=config)
    except REJECTION_TYPES as exc:
        outcome = PointOutcome("rejected", _one_line(exc))
    except Exception as exc:  # noqa: BLE001 - reported per point, the audit goes on
        outcome = PointOutcome("error", f"deepspeed.initialize: {_one_line(exc)}")
    else:
        try:
            outcome = _measure(engine, point, specs, rank, device)
        except Exception as exc:  # noqa: BLE001
            outcome = PointOutcome("error", _one_line(exc))
        finally:
            try:
                destroy_engine(engine)
            finally:
                del engine
    del optimizer, model
    # Freeze what survives this point's collection: DeepSpeed's own gc.collect() calls then skip it.
    gc.collect()
    gc.freeze()
    outcome.seconds = time.monotonic() - start
    return outcome


def _measure(engine, point: AuditPoint, specs, rank: int, device: str) -> PointOutcome:
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
    return PointOutcome("ran", optimizer=type(engine.optimizer).__name__, grads=grads)


def _path(point: AuditPoint, param, z3_paths, calls: list[str]) -> str:
    if point.stage == 3:
        if id(param) not in z3_paths:
            raise RuntimeError("a gradient went through neither ZeRO-3 reduce path")
        return str(z3_paths[id(param)])
    if point.stage == 0:
        return STAGE_0_PATH if calls else "engine (no allreduce_bucket call)"
    for method, suffix in zip(STAGE_1_2_METHODS, ("", "[reduce_scatter]", "")):
        if method in calls:
            return f"stage_1_and_2.{method}{suffix}"
    return "stage_1_and_2 (no reduce method observed)"


def _watch_methods(obj, names, calls: list[str]) -> None:
    """Record calls of ``obj``'s own methods by name."""
    for name in (n for n in names if getattr(type(obj), n, None) is not None):
        spy(obj, name, lambda *_, _name=name, **__: calls.append(_name))


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
