"""The program both gradient-scale reproducers run: flags, launch, and each rank's work (rank 0 reports; every
rank computes the whole oracle itself, no collectives)."""

from __future__ import annotations

from typing import Callable, Sequence

from repro.gradscale.expect import matches
from repro.gradscale.measure import Measured, run_config
from repro.gradscale.oracle import expected_gradients
from repro.gradscale.report import Report, Row, emit
from repro.gradscale.space import ParamSpec, ZeroConfig
from repro.harness import launch, scales
from repro.harness.cli import ReproArgs, main_guard
from repro.harness.scales import ReducePath
from repro.harness.topology import build_mpu


def make_rows(zero: ZeroConfig, measured: Sequence[Measured], expected: dict, sp: int, expect: str) -> list[Row]:
    rows = []
    for m in measured:
        oracle = expected[m.name]
        fit = scales.fit(m.full_grad, oracle)
        target, buggy_target = (scales.expected_scale(m.path, sp, e) for e in (expect, "buggy"))
        ok, buggy_ok, fixed_ok = (matches(m.full_grad, oracle, scale) for scale in (target, buggy_target, 1.0))
        rows.append(
            Row(config=zero.label(), stage=zero.stage, reduce_scatter=zero.reduce_scatter,
                contiguous_gradients=zero.contiguous_gradients, reduce_bucket_size=zero.reduce_bucket_size,
                param=m.name, numel=m.numel, path=str(m.path), observed_norm=fit.observed_norm,
                expected_norm=fit.expected_norm, ratio=fit.ratio, residual=fit.residual,
                label=scales.label(fit.ratio, fit.residual), target=target, ok=ok, buggy_target=buggy_target,
                buggy_ok=buggy_ok, fixed_ok=fixed_ok))
    return rows


Check = Callable[[list[Row]], None]  # raises when a run did not exercise what the script is about


def rank_program(script: str, configs: Sequence[ZeroConfig], specs: tuple[ParamSpec, ...],
                 check: Check | None = None) -> launch.RankProgram:

    def program(ctx: launch.RankContext) -> launch.RankResult:
        mpu = build_mpu(ctx.topology)
        expected = expected_gradients(specs, ctx.topology)
        rows: list[Row] = []
        for zero in configs:
            measured = run_config(zero, specs, ctx.rank, ctx.device, mpu)
            rows += make_rows(zero, measured, expected, ctx.topology.sp, ctx.args.expect)
        if check is not None:
            check(rows)
        report = Report(**launch.launch_fields(ctx, script), rows=rows)
        return launch.RankResult(report.exit_code, report.to_dict() if ctx.rank == 0 else None)

    return program


Select = Callable[[ReproArgs], Sequence[ZeroConfig]]


def main(description: str, script: str, select_configs: Select, specs: tuple[ParamSpec, ...], add_arguments=None,
         check: Check | None = None, argv: list[str] | None = None) -> int:

    def launch_ranks(args: ReproArgs) -> int:
        program = rank_program(script, select_configs(args), specs, check)
        return launch.run(args, program, lambda report, wall: emit(report, wall, args.json))

    return main_guard(description, launch_ranks, add_arguments, argv)


def require_paths(*paths: ReducePath) -> Check:
    """A check that every given path carried at least one gradient."""

    def check(rows: list[Row]) -> None:
        if missing := [str(p) for p in paths if not any(r.path == str(p) for r in rows)]:
            raise RuntimeError(f"no gradient went through {', '.join(missing)}: the scenario did not occur")

    return check
