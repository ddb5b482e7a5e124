"""The program both gradient-scale reproducers run: flags, launch, and each rank's work (one engine per ZeRO
configuration; rank 0 reports; every rank computes the whole oracle itself, no collectives)."""

from __future__ import annotations

import dataclasses
import gc
from typing import Callable, Sequence

import torch

from repro.gradscale.model import ProbeModel, expected_gradients, rank_inputs
from repro.gradscale.report import Report, Row
from repro.gradscale.space import ParamSpec, ZeroConfig
from repro.harness import launch, scales
from repro.harness.cli import ReproArgs, main_guard
from repro.harness.engine import destroy_engine, ds_config, full_gradients, watch_reduce_paths, zero3_path
from repro.harness.scales import TOLERANCES, ReducePath, default_path
from repro.harness.topology import build_mpu


def matches(observed: torch.Tensor, expected: torch.Tensor, scale: float) -> bool:
    """Elementwise: observed == scale * expected within the fp32 tolerances."""
    tol = TOLERANCES["gradscale"]
    target = expected.detach().double().cpu() * scale
    return bool(torch.allclose(observed.detach().double().cpu(), target, rtol=tol["rtol"], atol=tol["atol"]))


def measure(zero: ZeroConfig, specs: tuple[ParamSpec, ...], rank: int, device: str, mpu) -> list[tuple]:
    """One forward/backward on this rank's inputs: (spec, full gradient, reduce path) of every parameter."""
    import deepspeed

    model = ProbeModel(specs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu, config=ds_config(zero))
    try:
        paths = watch_reduce_paths(engine.optimizer) if zero.stage == 3 else None
        engine.backward(engine(*rank_inputs(specs, rank, device=device)))
        where, what = f"{zero.label()}: ", "the gradient of a parameter"
        grads = full_gradients(engine, [f"weights.{s.name}" for s in specs], where)
        return [(spec, grad.detach().float().cpu().clone(),
                 default_path(zero.stage) if paths is None else zero3_path(paths, param, where, what))
                for spec, (_, param, grad) in zip(specs, grads)]
    finally:
        destroy_engine(engine)
        del engine, optimizer, model
        gc.collect()


def make_rows(zero: ZeroConfig, measured: Sequence[tuple], expected: dict, sp: int, expect: str) -> list[Row]:
    rows = []
    for spec, grad, path in measured:
        oracle = expected[spec.name]
        fit = scales.fit(grad, oracle)
        target, buggy_target = (scales.expected_scale(path, sp, e) for e in (expect, "buggy"))
        ok, buggy_ok, fixed_ok = (matches(grad, oracle, scale) for scale in (target, buggy_target, 1.0))
        rows.append(
            Row(config=zero.label(), **dataclasses.asdict(zero), param=spec.name, numel=spec.numel, path=str(path),
                **dataclasses.asdict(fit), label=scales.label(fit.ratio, fit.residual), target=target, ok=ok,
                buggy_target=buggy_target, buggy_ok=buggy_ok, fixed_ok=fixed_ok))
    return rows


def main(description: str, script: str, select_configs: Callable[[ReproArgs],
                                                                 Sequence[ZeroConfig]], specs: tuple[ParamSpec, ...],
         add_arguments=None, required_paths: Sequence[ReducePath] = (), argv: list[str] | None = None) -> int:
    """``required_paths``: each must carry a gradient, else the run did not exercise what the script is about."""

    def launch_ranks(args: ReproArgs) -> int:
        configs = select_configs(args)

        def program(ctx: launch.RankContext) -> launch.RankResult:
            mpu = build_mpu(ctx.topology)
            expected = expected_gradients(specs, ctx.topology)
            rows = [
                row for zero in configs for row in make_rows(zero, measure(zero, specs, ctx.rank, ctx.device, mpu),
                                                             expected, ctx.topology.sp, ctx.args.expect)
            ]
            if missing := [str(p) for p in required_paths if not any(r.path == str(p) for r in rows)]:
                raise RuntimeError(f"no gradient went through {', '.join(missing)}: the scenario did not occur")
            report = Report(**launch.launch_fields(ctx, script), rows=rows)
            return launch.RankResult(report.exit_code, report.to_dict() if ctx.rank == 0 else None)

        return launch.run(args, program, lambda report, wall: Report.emit(report, wall, args.json))

    return main_guard(description, launch_ranks, add_arguments, argv)
