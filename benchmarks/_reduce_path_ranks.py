"""Rank side of benchmarks/reduce_path.py (timing and numerics launches) and its numerics: designed inputs, ULP
errors against the float64 oracle. Method: docs/code/benchmarks.md.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import importlib.util
import inspect
import itertools
import math
import os
import statistics
import random
import sys
import time
import types
from pathlib import Path
from typing import Callable

import torch

from repro.harness.launch import RankContext, RankResult
from repro.harness.engine import destroy_engine, ds_config, mangled_name, spy
from repro.gradscale.model import ProbeModel, expected_gradient, rank_inputs
from repro.gradscale.space import ParamSpec, ZeroConfig
from repro.harness.scales import ReducePath
from repro.harness.topology import build_mpu

AVG, CONTIGUOUS = ReducePath.AVG_SCATTER.value, ReducePath.CONTIGUOUS.value  # ZeRO-3's two reduce methods

BITS_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}

# Input kinds. "exact": per element an exponent shared by all ranks and a small integer per rank, so that every
# partial sum over <= 16 ranks is exact in bf16, fp16 and fp32 (as is a division by a power of two).
KINDS = ("exact", "random", "small")
_EXACT_MAX_INT = 15
_EXACT_EXPONENTS = range(-6, 3)


def ulp_of(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each element of ``reference`` (float64), exactly."""
    info = torch.finfo(dtype)
    emin = math.log2(info.smallest_normal)  # below it (subnormals) the spacing stays that of the smallest normal
    ref = reference.double().abs()
    _, exponent = torch.frexp(ref)  # ref = m * 2**exponent, m in [0.5, 1): floor(log2 ref) = exponent - 1
    floor_log2 = torch.where(ref > 0, exponent.double() - 1, torch.full_like(ref, emin))
    return torch.exp2(floor_log2.clamp(min=emin)) * info.eps


def ulp_error(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (value.double() - reference.double()).abs() / ulp_of(reference, dtype)


def rank_gradient(kind: str, numel: int, rank: int, param_index: int, dtype: torch.dtype,
                  seed: int = 8692) -> torch.Tensor:
    if kind not in KINDS:
        raise ValueError(f"unknown input kind {kind!r}; one of {KINDS}")
    own = torch.Generator().manual_seed(seed * 1_000_003 + param_index * 1009 + rank)
    if kind == "exact":
        shared = torch.Generator().manual_seed(seed * 1_000_003 + param_index * 1009 + 999)  # same on every rank
        exps = torch.randint(min(_EXACT_EXPONENTS), max(_EXACT_EXPONENTS) + 1, (numel, ), generator=shared)
        ints = torch.randint(-_EXACT_MAX_INT, _EXACT_MAX_INT + 1, (numel, ), generator=own)
        values = ints.double() * torch.exp2(exps.double())
    else:
        values = torch.randn(numel, generator=own, dtype=torch.float64)
        if kind == "small":
            values = values * 2.0**-12
    return values.to(dtype).double()  # rounded to dtype and back: what a rank can hold in that format


def partition_slice(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of ``rank``'s ZeRO-3 partition (ceil chunks)."""
    chunk = -(-numel // world_size)
    start = min(rank * chunk, numel)
    return start, min(start + chunk, numel)


@dataclasses.dataclass
class ErrorStats:
    """ULP errors of one path against the oracle, mergeable across ranks; max/mean over the oracle's non-zeros."""

    n: int = 0
    n_exact: int = 0  # equal to the oracle
    n_rounded: int = 0  # within 0.5 ULP: the oracle correctly rounded (0 where the oracle is 0)
    n_nonzero: int = 0
    n_zero_missed: int = 0  # oracle 0, path not
    max_ulp: float = 0.0
    sum_ulp: float = 0.0
    scale_samples: list = dataclasses.field(default_factory=list)  # median output / oracle, one per call

    def add(self, value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
        value, reference = value.double(), reference.double()
        zero = reference == 0
        err = ulp_error(value[~zero], reference[~zero], dtype)
        self.n += value.numel()
        self.n_exact += int((value == reference).sum())
        self.n_nonzero += err.numel()
        self.n_rounded += int((err <= 0.5).sum()) + int((value[zero] == 0).sum())
        self.n_zero_missed += int((value[zero] != 0).sum())
        if err.numel():
            self.max_ulp = max(self.max_ulp, float(err.max()))
            self.sum_ulp += float(err.sum())
            self.scale_samples.append(float((value[~zero] / reference[~zero]).median()))

    def merge(self, other: ErrorStats) -> None:
        for f in ("n", "n_exact", "n_rounded", "n_nonzero", "n_zero_missed", "sum_ulp"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.max_ulp = max(self.max_ulp, other.max_ulp)
        self.scale_samples.extend(other.scale_samples)

    def summary(self) -> dict:
        scales = sorted(self.scale_samples)
        return dict(elements=self.n, max_ulp=self.max_ulp,
                    mean_ulp=self.sum_ulp / self.n_nonzero if self.n_nonzero else 0.0,
                    exact_fraction=self.n_exact / self.n if self.n else 0.0,
                    correctly_rounded_fraction=self.n_rounded / self.n if self.n else 0.0,
                    zero_oracle=self.n - self.n_nonzero, zero_oracle_missed=self.n_zero_missed,
                    scale=scales[len(scales) // 2] if scales else None)


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor], dtype: torch.dtype) -> bool:
    """Same bits in ``dtype`` (the reduction's format: both outputs come from it, so the cast is exact)."""
    if len(a) != len(b):
        return False
    view = BITS_VIEW[dtype]
    return all(x.numel() == y.numel() and torch.equal(x.to(dtype).view(view),
                                                      y.to(dtype).view(view)) for x, y in zip(a, b))


Impl = collections.namedtuple("Impl", "avg_scatter contiguous")  # one tree's two reduce methods


def load_impls(spec: dict[str, str]) -> dict[str, Impl]:
    """{name: deepspeed package dir} -> the two reduce methods of each, loaded from that tree's two files."""
    import deepspeed.runtime.comm.coalesced_collectives as installed_cc
    import deepspeed.runtime.zero.stage3  # noqa: F401  (its imports are then cached for the copies)

    impls = {}
    for name, package in spec.items():
        package = Path(package)
        cc = _load_module(package / "runtime" / "comm" / "coalesced_collectives.py", f"_reduce_path_{name}_cc")
        stage3 = _load_module(package / "runtime" / "zero" / "stage3.py", f"_reduce_path_{name}_stage3")
        # stage3 did `from deepspeed.runtime.comm.coalesced_collectives import ...` against the
        # installed module: rebind what it took from there to this tree's own definitions.
        taken = vars(installed_cc)
        for attr, value in list(vars(stage3).items()):
            if attr in taken and taken[attr] is value and attr in vars(cc) and not isinstance(value, types.ModuleType):
                setattr(stage3, attr, vars(cc)[attr])
        cls = stage3.DeepSpeedZeroOptimizer_Stage3
        impls[name] = Impl(_with_dtype(vars(cls)[f"_{cls.__name__}{AVG}"]),
                           _with_dtype(vars(cls)[f"_{cls.__name__}{CONTIGUOUS}"]))
    return impls


def _with_dtype(method: Callable) -> Callable:
    """``method(opt, first, comm_dtype)`` whatever the release: before 0.17 these methods took no dtype."""
    inner = method
    while not isinstance(inspect.signature(inner).parameters.get("self"), inspect.Parameter):
        # DeepSpeed's instrument_w_nvtx wraps without functools.wraps: the method is in its closure
        inner = next(c.cell_contents for c in inner.__closure__ if inspect.isfunction(c.cell_contents))
    if len(inspect.signature(inner).parameters) >= 3:
        return method
    return lambda opt, first, comm_dtype: method(opt, first)


def _load_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sync() -> None:
    from deepspeed.accelerator import get_accelerator
    get_accelerator().synchronize()


def _gather(obj) -> list:
    import torch.distributed as tdist

    out = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def _one_backward(specs: tuple[ParamSpec, ...], zero: ZeroConfig, mpu, dtype: str, ctx: RankContext, method: str,
                  make_hook: Callable, what: str) -> list:
    """One engine's forward and backward with its optimizer's ``method`` wrapped by ``make_hook(engine)``: what the
    hook returned, a call each (none: RuntimeError, ``what`` naming the backward)."""
    import deepspeed

    model = ProbeModel(specs)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), mpu=mpu,
                                      config=ds_config(zero, **precision_overrides(dtype)))
    calls = []
    try:
        opt, hook = engine.optimizer, make_hook(engine)
        # (first, comm_dtype) from 0.17 on; (first) before
        spy(opt, mangled_name(opt, method),
            lambda first, *dtype: calls.append(hook(opt, first, dtype[0] if dtype else opt.communication_data_type)))
        loss = engine(*rank_inputs(specs, ctx.rank, device=ctx.device))
        engine.backward(loss)
    finally:
        destroy_engine(engine)
        del engine
        gc.collect()
    if not calls:
        raise RuntimeError(f"{what}: the backward never reduced on {AVG if method == AVG else 'the contiguous path'}")
    return calls


def precision_overrides(dtype: str) -> dict:
    """DeepSpeed config for one precision setting (names as in --dtypes; what each means: docs/code/benchmarks.md)."""
    comm = dict(seq_parallel_communication_data_type=dtype, communication_data_type=dtype)
    bf16 = {"bf16": {"enabled": True}}
    table = {"fp32": {}, "bf16-model": bf16, "bf16": {**bf16, **comm}, "fp16": comm}
    if dtype not in table:
        *names, last = table
        raise ValueError(f"unknown precision setting {dtype!r}: {', '.join(names)} or {last}")
    return table[dtype]


def timing_program(impl_spec: dict[str, str], dtypes: tuple[str, ...], cases: dict[str, tuple[int, int]], warmup: int,
                   iters: int) -> Callable[[RankContext], RankResult]:
    """``cases``: label -> (number of parameters, elements each)."""

    def program(ctx: RankContext) -> RankResult:
        impls = load_impls(impl_spec)
        mpu = build_mpu(ctx.topology)
        out = []
        for label, (count, numel) in cases.items():
            specs = tuple(ParamSpec(f"p{i:04d}", numel) for i in range(count))
            for dtype in dtypes:
                buckets = _one_backward(
                    specs, ZeroConfig(3), mpu, dtype, ctx,
                    AVG, lambda engine: lambda opt, params, comm_dtype: _time_bucket(
                        opt, list(params), comm_dtype, impls, warmup, iters, ctx), f"{label}/{dtype}")
                out.append({"case": label, "params": count, "numel_each": numel, "dtype": dtype, "buckets": buckets})
        return _report(ctx, "timing", cases=out)

    return program


def _report(ctx: RankContext, phase: str, **data) -> RankResult:
    """Rank 0's report, with the rendezvous address: DeepSpeed's CPU comm op names its /dev/shm buffers after it."""
    info = {"master_addr": os.environ.get("MASTER_ADDR"), "master_port": os.environ.get("MASTER_PORT")}
    return RankResult(0, {"phase": phase, **data, **info} if ctx.rank == 0 else None)


def _clocked(call: Callable, *args) -> tuple[float, float]:
    """Wall and CPU seconds (this process, all threads) of ``call(*args)`` up to the device's synchronize."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = call(*args)
    _sync()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    del out  # freed once the clocks have stopped
    return wall, cpu


def _time_bucket(opt, params: list, comm_dtype: torch.dtype, impls: dict[str, Impl], warmup: int, iters: int,
                 ctx: RankContext) -> dict:
    from deepspeed import comm as dist

    grads = [p.grad for p in params]
    saved = [g.detach().clone() for g in grads]

    def restore() -> None:
        for g, s in zip(grads, saved):
            g.copy_(s)

    names = list(impls)
    # What each implementation returns on this bucket, before any timing.
    outputs = {}
    for n in names:
        restore()
        outputs[n] = [o.detach().double().cpu().clone() for o in impls[n].avg_scatter(opt, params, comm_dtype)]
    # Relations between the implementations' outputs on this rank's partitions.
    ref = torch.cat([o.flatten() for o in outputs["before"]])
    nonzero, checks = ref.abs() > 0, {}
    for n in names:
        if n != "before":
            mine = torch.cat([o.flatten() for o in outputs[n]])
            checks[f"{n}/before"] = float((mine[nonzero] / ref[nonzero]).median()) if bool(nonzero.any()) else None
    for a, b in itertools.combinations(names, 2):
        checks[f"{a}=={b} bitwise"] = bitwise_equal(outputs[a], outputs[b], comm_dtype)
    checks["expected_ratio"] = float(ctx.topology.sp)

    times: dict[str, list[float]] = {n: [] for n in names}  # wall clock of the call on this rank
    cpu: dict[str, list[float]] = {n: [] for n in names}  # CPU time of this process (all threads)
    gc.collect()
    gc.disable()
    try:
        for it in range(warmup + iters):
            # A fresh order each round, the same on every rank (seeded by the round): docs/code/benchmarks.md.
            order = list(names)
            random.Random(it).shuffle(order)
            for n in order:
                restore()
                _sync()
                dist.barrier()
                elapsed, used = _clocked(impls[n].avg_scatter, opt, params, comm_dtype)
                if it >= warmup:
                    times[n].append(elapsed)
                    cpu[n].append(used)
    finally:
        gc.enable()

    allocations = {
        n: _allocations(lambda n=n: impls[n].avg_scatter(opt, params, comm_dtype), restore, ctx)
        for n in names
    }
    # What the rescale form adds, alone and with no collective: ``[g.mul(sp) for g in partitions]``.
    parts, scale = [p.to(comm_dtype).contiguous() for p in outputs["before"]], float(ctx.topology.sp)
    wall, used = zip(*[_clocked(lambda: [g.mul(scale) for g in parts]) for _ in range(2 * iters)])
    isolated = dict(wall_median_s=statistics.median(wall), cpu_median_s=statistics.median(used), repeats=2 * iters,
                    tensors=len(parts), elements=sum(p.numel() for p in parts))
    restore()

    partition_group = getattr(opt, "_get_param_partition_group", None)  # from 0.19.3 (AutoEP); dp before
    process_group = partition_group(params[0]) if partition_group else opt.dp_process_group
    world, rank = dist.get_world_size(group=process_group), dist.get_rank(group=process_group)
    partition_elements = sum(end - start
                             for start, end in (partition_slice(p.grad.numel(), world, rank) for p in params))
    per_rank = _gather(
        dict(times=times, cpu=cpu, allocations=allocations, partition_elements=partition_elements, isolated=isolated))
    # Per round: the step's time is its slowest rank's; the work done, all ranks' CPU time together.
    step_times = {n: [max(r["times"][n][i] for r in per_rank) for i in range(iters)] for n in names}
    cpu_times = {n: [sum(r["cpu"][n][i] for r in per_rank) for i in range(iters)] for n in names}
    rank_median = [{n: statistics.median(r["times"][n]) for n in names} for r in per_rank]
    isolated_all, allocations_all, elements_all = ([r[k] for r in per_rank]
                                                   for k in ("isolated", "allocations", "partition_elements"))
    return dict(bucket_params=len(params), bucket_elements=sum(g.numel() for g in grads),
                communication_dtype=str(comm_dtype).replace("torch.", ""),
                gradient_dtype=str(grads[0].dtype).replace("torch.", ""), partition_world_size=world,
                sequence_parallel_size=ctx.topology.sp, checks=checks, step_times_s=step_times, cpu_times_s=cpu_times,
                rank_median_s=rank_median, isolated_post_scale=isolated_all, allocations=allocations_all,
                partition_elements=elements_all, itemsize=torch.empty(0, dtype=comm_dtype).element_size())


def _allocations(call: Callable, restore: Callable, ctx: RankContext) -> dict:
    """Bytes the call allocates: CUDA allocator counters on GPU, else the profiler's memory events and their peak."""
    from deepspeed import comm as dist

    restore()
    _sync()
    dist.barrier()
    if ctx.device.startswith("cuda"):
        stats0 = torch.cuda.memory_stats()  #ignore-cuda
        torch.cuda.reset_peak_memory_stats()  #ignore-cuda
        base = torch.cuda.memory_allocated()  #ignore-cuda
        out = call()
        _sync()
        stats1 = torch.cuda.memory_stats()  #ignore-cuda
        peak = torch.cuda.max_memory_allocated() - base  #ignore-cuda
        del out
        return dict(method="cuda memory_stats",
                    bytes=stats1["allocated_bytes.all.allocated"] - stats0["allocated_bytes.all.allocated"],
                    count=stats1["allocation.all.allocated"] - stats0["allocation.all.allocated"], peak_bytes=peak)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = call()
        del out
    own = [e.self_cpu_memory_usage for e in sorted(prof.events(), key=lambda e: e.time_range.start)]  # < 0: freed
    allocs = [x for x in own if x > 0]
    return dict(method="torch.profiler profile_memory", bytes=sum(allocs), count=len(allocs),
                peak_bytes=max(itertools.accumulate(own, initial=0)))  # the running total's peak, from 0


# Sizes with and without padding (numel % world != 0 for world 2, 3, 4), one below the world size.
NUMERICS_SPECS = tuple(ParamSpec(f"n{i}", n) for i, n in enumerate((4096, 4097, 1000, 333, 64, 3, 16384, 20011)))


def numerics_program(impl_spec: dict[str, str], dtypes: tuple[str, ...],
                     kinds: tuple[str, ...]) -> Callable[[RankContext], RankResult]:

    def program(ctx: RankContext) -> RankResult:
        impls = load_impls(impl_spec)
        mpu = build_mpu(ctx.topology)
        bucket = sum(s.numel for s in NUMERICS_SPECS) * 2
        zero = ZeroConfig(3, reduce_scatter=False, contiguous_gradients=True, reduce_bucket_size=bucket)
        results = []
        for dtype in dtypes:
            names: dict[int, str] = {}

            def numerics_hook(engine):
                ordered = sorted(engine.module.named_parameters())
                index = {id(p): i for i, (_, p) in enumerate(ordered)}
                names.update({i: n for i, (n, _) in enumerate(ordered)})
                return lambda opt, buffer, comm_dtype: _numerics_bucket(opt, buffer, comm_dtype, impls, kinds, ctx,
                                                                        index)

            seen = _one_backward(NUMERICS_SPECS, zero, mpu, dtype, ctx, CONTIGUOUS, numerics_hook, f"numerics/{dtype}")
            results.append({"dtype": dtype, "param_names": names, **_merge_ranks(_gather(seen))})
        return _report(ctx, "numerics", results=results)

    return program


def _numerics_bucket(opt, buffer, comm_dtype: torch.dtype, impls: dict[str, Impl], kinds: tuple[str, ...],
                     ctx: RankContext, index: dict[int, int]) -> dict:
    from deepspeed import comm as dist

    bucket = opt.ipg_buckets[comm_dtype]
    params = list(bucket.params)
    ordered = sorted(params, key=lambda p: p.ds_id)  # as __reduce_and_partition_ipg_grads hands them over
    grads = {id(p): p.grad for p in params}
    saved = {k: g.detach().clone() for k, g in grads.items()}
    world, rank = dist.get_world_size(group=bucket.process_group), dist.get_rank(group=bucket.process_group)
    if world != ctx.world_size:
        raise RuntimeError(f"partition group has {world} ranks, expected the whole world ({ctx.world_size})")

    per_kind = {}
    for kind in kinds:
        local = {
            pid: [rank_gradient(kind, g.numel(), r, index[pid], comm_dtype) for r in range(world)]
            for pid, g in grads.items()
        }
        oracle = {pid: expected_gradient(ls, ctx.topology) for pid, ls in local.items()}

        def set_inputs() -> None:
            for pid, g in grads.items():
                g.copy_(local[pid][rank].view(g.shape).to(g.dtype))

        paths: dict[str, tuple[list, list]] = {}  # path -> (params in output order, outputs)
        set_inputs()
        paths["contiguous"] = (params, impls["before"].contiguous(opt, buffer, comm_dtype))
        for name, impl in impls.items():
            set_inputs()
            paths[f"avg_scatter[{name}]"] = (ordered, impl.avg_scatter(opt, ordered, comm_dtype))

        stats, trimmed = {}, {}
        for path, (order, outs) in paths.items():
            st = ErrorStats()
            by_param = {}
            for p, out in zip(order, outs):
                start, end = partition_slice(grads[id(p)].numel(), world, rank)
                value = out.detach().flatten()[:end - start].double().cpu()
                st.add(value, oracle[id(p)][start:end], comm_dtype)
                by_param[id(p)] = value
            stats[path] = st
            trimmed[path] = [by_param[id(p)] for p in params]
        pairs = itertools.combinations(trimmed, 2)
        equal = {f"{a}=={b}": bitwise_equal(trimmed[a], trimmed[b], comm_dtype) for a, b in pairs}
        per_kind[kind] = {"stats": stats, "bitwise": equal}

    for pid, g in grads.items():
        g.copy_(saved[pid])
    return dict(communication_dtype=str(comm_dtype).replace("torch.", ""),
                gradient_dtype=str(next(iter(grads.values())).dtype).replace("torch.", ""),
                elements=sum(g.numel() for g in grads.values()), kinds=per_kind)


def _merge_ranks(per_rank: list[list[dict]]) -> dict:
    """Every rank's view of each bucket -> one summary: stats merged, bitwise equal on every rank."""
    buckets = []
    for seen in zip(*per_rank):
        first = seen[0]
        kinds = {}
        for kind in first["kinds"]:
            views = [r["kinds"][kind] for r in seen]
            stats = {}
            for path in views[0]["stats"]:
                st = ErrorStats()
                for v in views:
                    st.merge(v["stats"][path])
                stats[path] = st.summary()
            bitwise = {pair: all(v["bitwise"][pair] for v in views) for pair in views[0]["bitwise"]}
            kinds[kind] = {"paths": stats, "bitwise_equal_all_ranks": bitwise}
        buckets.append({k: first[k] for k in ("communication_dtype", "gradient_dtype", "elements")} | {"kinds": kinds})
    return buckets[0] if len(buckets) == 1 else {"buckets": buckets}
