"""Run audit points through a real DeepSpeed engine and observe, changing nothing, which code reduced each
gradient; a point DeepSpeed refuses while building the engine is "rejected", any other failure an "error"."""

from __future__ import annotations

import functools
import gc
import time

import torch

from repro.audit.report import MeasuredPoint, MeasuredRow, raw_point
from repro.audit.space import AuditPoint
from repro.gradscale.model import ProbeModel, expected_gradients, rank_inputs
from repro.gradscale.space import SMALL_AND_LARGE, ParamSpec
from repro.harness.engine import destroy_engine, ds_config, full_gradients, spy, watch_reduce_paths, zero3_path
from repro.harness.scales import fit
from repro.harness.topology import Topology, build_mpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# DeepSpeed's "not supported" while it builds an engine (pydantic's ValidationError is a ValueError).
REJECTION_TYPES = (AssertionError, ValueError, NotImplementedError)

STAGE_1_2_METHODS = ("gradient_reduction_w_predivide", "average_tensor", "buffered_reduce_fallback")


def run_topology(points: list[AuditPoint], topology: Topology, rank: int, device: str) -> list[MeasuredPoint]:
    """Every point of one (world, sp), each against the plain-torch oracle of its gas and dtype."""
    _reset_sp_state()
    mpu = build_mpu(topology)
    oracle = functools.cache(
        lambda gas, dtype: expected_gradients(SMALL_AND_LARGE, topology, micro_steps=gas, model_dtype=DTYPES[dtype]))
    return [run_point(p, SMALL_AND_LARGE, rank, device, mpu, oracle(p.gas, p.dtype)) for p in points]


def run_point(point: AuditPoint, specs: tuple[ParamSpec, ...], rank: int, device: str, mpu,
              expected: dict[str, torch.Tensor]) -> MeasuredPoint:
    import deepspeed

    start = time.monotonic()
    model = ProbeModel(specs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    config = ds_config(point.zero_section(), **point.config_overrides())
    status, message, optimizer_name, grads = "ran", "", "", []
    try:
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu, config=config)
    except REJECTION_TYPES as exc:
        status, message = "rejected", _one_line(exc)
    except Exception as exc:  # noqa: BLE001 - reported per point, the audit goes on
        status, message = "error", f"deepspeed.initialize: {_one_line(exc)}"
    else:
        try:
            optimizer_name, grads = type(engine.optimizer).__name__, _measure(engine, point, specs, rank, device)
        except Exception as exc:  # noqa: BLE001
            status, message = "error", _one_line(exc)
        finally:
            try:
                destroy_engine(engine)
            finally:
                del engine
    del optimizer, model
    # Freeze what survives this point's collection: DeepSpeed's own gc.collect() calls then skip it.
    gc.collect()
    gc.freeze()
    seconds = time.monotonic() - start
    # Against the oracle outside the per-point catch: a failing comparison is the audit's own error (exit 2).
    rows = []
    for spec, observed, path, dtype in grads:
        f = fit(observed, expected[spec.name])
        rows.append(
            MeasuredRow(param=spec.name, numel=spec.numel, path=path, grad_dtype=dtype, ratio=f.ratio,
                        residual=f.residual, max_rel_dev=_max_rel_dev(observed, expected[spec.name], f.ratio)))
    return raw_point(point, status, message, optimizer_name, seconds, rows)


def _measure(engine, point: AuditPoint, specs, rank: int, device: str) -> list[tuple]:
    """(spec, full gradient as float64 on the cpu, observed reduce path, dtype DeepSpeed returned) per parameter."""
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
    measured = []
    for spec, (_, param, grad) in zip(specs, full_gradients(engine, [f"weights.{s.name}" for s in specs])):
        dtype = str(grad.dtype).replace("torch.", "")
        measured.append((spec, grad.detach().double().cpu().clone(), _path(point, param, z3_paths, calls), dtype))
    return measured


def _path(point: AuditPoint, param, z3_paths, calls: list[str]) -> str:
    if point.stage == 3:
        return str(zero3_path(z3_paths, param))
    if point.stage == 0:
        return "engine.allreduce_bucket" if calls else "engine (no allreduce_bucket call)"
    for method, suffix in zip(STAGE_1_2_METHODS, ("", "[reduce_scatter]", "")):
        if method in calls:
            return f"stage_1_and_2.{method}{suffix}"
    return "stage_1_and_2 (no reduce method observed)"


def _watch_methods(obj, names, calls: list[str]) -> None:
    for name in (n for n in names if getattr(type(obj), n, None) is not None):
        spy(obj, name, lambda *_, _name=name, **__: calls.append(_name))


def _max_rel_dev(observed, expected, ratio: float) -> float:
    target = expected.double() * ratio
    return float(((observed.double() - target).abs() / target.abs().clamp_min(1e-30)).max()) if target.numel() else 0.0


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]  # never empty: the type's name leads


def _reset_sp_state() -> None:
    """Forget the previous topology's sp groups (``groups.mpu``, 0.17+'s ``parallel_state_sp`` globals) before
    building the next one's mpu: one process group runs several sp values under an external launcher."""
    from deepspeed.utils import groups

    groups.mpu = None
    try:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
    except ImportError:
        return
    parallel_state_sp._SEQUENCE_PARALLEL_GROUP = None
    parallel_state_sp._SEQUENCE_DATA_PARALLEL_GROUP = None
