"""Gradient-scale parity audit: every ZeRO configuration point against one plain-torch oracle.

For each point of the space (ZeRO stage 0-3; reduce_scatter, contiguous_gradients, a reduce
bucket that fits the probe's parameters and one that does not; sp in {1, 2, 4} x dp in {1, 2}
up to 4 ranks; fp32 and bf16; gradient_accumulation_steps 1 and 2; gradient_predivide_factor
1.0, the world size and 3.0; prescale_gradients off and on) a real DeepSpeed engine runs one
training step's backward on every rank, and each parameter's full gradient is compared with the
oracle: sum over the sp ranks, mean over the dp ranks, mean over the micro-steps of the ranks'
local gradients, computed in plain torch (float64). Configurations DeepSpeed refuses are
reported as rejected, not as failures.

--expect buggy holds when every gradient reduced by ZeRO-3's __avg_scatter_grads with sp > 1 is
at 1/sp and every other one matches the oracle, each up to the known upstream discrepancies
listed in repro/audit/known_discrepancies.toml (written up in docs/upstream-candidates/);
--expect fixed likewise with the first kind at 1.0.

Local launch (default): one launch of the ranks per topology (world size, sp), one after the
other, each running all of its points in one process group (one engine per point, destroyed
before the next); the parent merges the reports. --world-size and --sp restrict the topologies.
Under torchrun / the deepspeed launcher: the launcher's world size only, every sp that divides
it (or --sp), in the one process group.

--timeout is the deadline of the whole audit: each launch gets what is left of it.

The runnable script is repro/parity_audit.py (``main`` below); every rank it starts runs it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from repro.audit.expect import DEFAULT_KNOWN_FILE, load_known
from repro.audit.report import AuditReport, raw_point, raw_row, render_summary, render_table
from repro.audit.space import (DP_VALUES, DTYPES, GAS_VALUES, MODES, SP_VALUES, STAGES, Topo, group_by_topology,
                               select, topologies)
from repro.harness import launch
from repro.harness.env import dist_version
from repro.harness.cli import EXIT_ERROR, EXIT_SKIP, ReproArgs, UsageError, build_parser, gpu_count, validate

SCRIPT = "parity_audit"
REPO_ROOT = Path(__file__).resolve().parents[2]
# What the ranks of a local launch run (launch.run starts sys.argv[0] with sys.argv[1:]).
ENTRY_SCRIPT = REPO_ROOT / "repro" / "parity_audit.py"
DEFAULT_TIMEOUT_S = 3600.0
# A launch with less than this left of the deadline is not started.
MIN_LAUNCH_S = 20.0

EXPECT_HELP = (
    "what must hold at every point: buggy: ZeRO-3's __avg_scatter_grads gradients with sp > 1 at 1/sp, every "
    "other at the oracle; fixed: all at the oracle; both up to the known discrepancies (default fixed)")


def _add_arguments(parser) -> None:
    parser.set_defaults(timeout=DEFAULT_TIMEOUT_S)
    # Unset, --world-size and --sp mean every topology of the audit's space and --backend a choice per topology:
    # defaults of None tell them apart from given values (abbreviated ones included).
    parser.add_argument(
        "--world-size", type=int,
        help="only the topologies of this world size (default: every one, up to 4 ranks; under "
        "torchrun its world size)")
    parser.add_argument(
        "--sp", type=int,
        help=f"only the topologies of this sp (default: every one of {', '.join(map(str, SP_VALUES))} "
        "that divides the world size)")
    parser.add_argument(
        "--backend", choices=["gloo", "nccl", "auto"],
        help="gloo: CPU ranks; nccl: one GPU per rank; auto (default): for each topology, nccl when "
        "there is a GPU for every rank, else gloo")
    parser.add_argument(
        "--mode", choices=MODES, default="quick",
        help="quick: a covering subset (every factor level, every reduce path); full: the whole "
        "space (default quick)")
    parser.add_argument("--stage", type=int, action="append", choices=STAGES,
                        help="only these ZeRO stages (repeatable)")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="only these dtypes (repeatable)")
    parser.add_argument("--gas", type=int, action="append", choices=GAS_VALUES,
                        help="only these gradient_accumulation_steps (repeatable)")
    parser.add_argument("--point", action="append", metavar="GLOB",
                        help="only points whose id matches this glob, e.g. 'z3.*/sp2dp1/*' (repeatable)")
    parser.add_argument("--known", type=Path, default=DEFAULT_KNOWN_FILE,
                        help="the known-discrepancy file (default repro/audit/known_discrepancies.toml)")
    parser.add_argument("--no-known", action="store_true",
                        help="judge without the known discrepancies: every other upstream bug shows as unexplained")
    parser.add_argument("--table", choices=["all", "failing", "none"], default="all",
                        help="print every point, only points off the expectation, or none (default all)")
    parser.add_argument("--list", action="store_true", help="print the selected points by topology and exit")
    parser.add_argument("--from-json", type=Path, metavar="REPORT",
                        help="judge a previous audit's JSON again (with --known and --expect); runs nothing")


@dataclasses.dataclass(frozen=True)
class Selection:
    mode: str
    stages: tuple[int, ...] | None
    dtypes: tuple[str, ...] | None
    gas: tuple[int, ...] | None
    patterns: tuple[str, ...] | None

    @classmethod
    def of(cls, args: ReproArgs) -> Selection:
        e = args.extra

        def t(x):
            return tuple(x) if x else None

        return cls(e["mode"], t(e["stage"]), t(e["dtype"]), t(e["gas"]), t(e["point"]))

    def points(self, topos):
        return select(self.mode, topos, self.stages, self.dtypes, self.gas, self.patterns)

    def argv(self) -> list[str]:
        out = ["--mode", self.mode]
        for flag, values in (("--stage", self.stages), ("--dtype", self.dtypes), ("--gas", self.gas), ("--point",
                                                                                                       self.patterns)):
            for v in values or ():
                out += [flag, str(v)]
        return out


# --------------------------------------------------------------------------- entry


def main(argv: list[str] | None = None) -> int:
    """The audit's entry: ``argv`` (default ``sys.argv[1:]``) is parsed once, here."""
    parser = build_parser(__doc__.split("\n\n")[0], prog="parity_audit.py", expect_help=EXPECT_HELP)
    _add_arguments(parser)
    try:
        args = _repro_args(parser.parse_args(argv))
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    try:
        known = [] if args.extra["no_known"] else load_known(args.extra["known"], root=REPO_ROOT)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    if args.extra["from_json"] is not None:
        return _rejudge(args, known)
    if launch.CHILD_DIR_VAR in os.environ:  # a rank this audit spawned for one topology
        return launch.run(args, _rank_program(args, [args.sp], known), lambda report, wall: None)
    selection = Selection.of(args)
    explicit_ws, explicit_sp = args.extra["world_size_given"], args.extra["sp_given"]
    if launch.external_launcher_env():
        world = args.world_size
        sps = [args.sp] if explicit_sp else [t.sp for t in topologies([world])]
        topos = [Topo(world, sp) for sp in sps if Topo(world, sp) in topologies([world])]
        if not topos:
            print(
                f"error: world size {world} (sp {sps}) is outside the audit's space "
                f"(sp in {SP_VALUES}, dp in {DP_VALUES})", file=sys.stderr)
            return EXIT_ERROR
        if args.extra["list"]:
            return _list(selection, topos)

        def sink(partial: dict, wall: float) -> None:
            topo_runs = [dict(t, exit_code=0, wall_time_s=None, message="") for t in partial["topologies"]]
            report = _final(args, known, topo_runs, partial["points"], partial["meta"], "external")
            report.wall_time_s = round(wall, 3)
            _emit(report, args)

        return launch.run(args, _rank_program(args, [t.sp for t in topos], known), sink)
    topos = topologies([args.world_size] if explicit_ws else None, [args.sp] if explicit_sp else None)
    if not topos:
        print(
            f"error: no topology of the audit's space has world size {args.world_size if explicit_ws else 'any'} "
            f"and sp {args.sp if explicit_sp else 'any'} (sp in {SP_VALUES}, dp in {DP_VALUES}, "
            f"at most 4 ranks)", file=sys.stderr)
        return EXIT_ERROR
    if args.extra["list"]:
        return _list(selection, topos)
    return _parent(args, selection, topos, known)


def _repro_args(ns: argparse.Namespace) -> ReproArgs:
    """The parsed flags as the shared contract's ``ReproArgs``, validated by ``cli.validate``.

    ``extra`` records whether --world-size and --sp were given (``world_size_given``,
    ``sp_given``) and the --backend choice (``backend_choice``, "auto" when unset); where they were
    not, the contract's checks see a world size and sp every topology accepts (sp 1; world size sp).
    """
    given = dict(world_size_given=ns.world_size is not None, sp_given=ns.sp is not None, backend_choice=ns.backend
                 or "auto")
    sp = ns.sp if given["sp_given"] else 1
    world_size = ns.world_size if given["world_size_given"] else sp
    filled = argparse.Namespace(**{
        **vars(ns), "world_size": world_size,
        "sp": sp,
        "backend": given["backend_choice"],
        **given
    })
    return validate(filled)


def _list(selection: Selection, topos) -> int:
    groups = group_by_topology(selection.points(topos))
    total = 0
    for topo, points in groups.items():
        print(f"# world {topo.world_size}, {topo.label()}: {len(points)} points")
        for p in points:
            print(p.id)
        total += len(points)
    print(f"# {total} points in {len(groups)} launches ({selection.mode})")
    return 0


# --------------------------------------------------------------------------- parent


def _parent(args: ReproArgs, selection: Selection, topos, known) -> int:
    started = time.monotonic()
    deadline = started + args.timeout
    groups = group_by_topology(selection.points(topos))
    if not groups:
        print("error: the filters select no point", file=sys.stderr)
        return EXIT_ERROR
    backend_choice = args.extra["backend_choice"]
    topo_runs, points, meta = [], [], {}
    for topo, topo_points in groups.items():
        left = deadline - time.monotonic()
        entry = dict(world_size=topo.world_size, sp=topo.sp, dp=topo.dp, points=len(topo_points))
        if left < MIN_LAUNCH_S:
            topo_runs.append(
                dict(entry, exit_code=EXIT_ERROR, wall_time_s=0.0,
                     message=f"not started: {left:.0f} s left of the {args.timeout:.0f} s deadline"))
            continue
        backend = backend_choice if backend_choice != "auto" else (
            "nccl" if gpu_count() >= topo.world_size else "gloo")
        child_args = dataclasses.replace(args, world_size=topo.world_size, sp=topo.sp, timeout=left, backend=backend,
                                         json=None)
        child_argv = [
            "--world-size",
            str(topo.world_size), "--sp",
            str(topo.sp), "--backend", backend, "--expect", args.expect, "--timeout", f"{left:.1f}", "--known",
            str(args.extra["known"]), *(["--no-known"] if args.extra["no_known"] else []), *selection.argv(),
            *(["--keep-logs"] if args.keep_logs else [])
        ]
        received: list[dict] = []
        print(
            f"[parity-audit] launch {topo.label()} (world {topo.world_size}, {backend}): {len(topo_points)} points, "
            f"{left:.0f} s left", file=sys.stderr, flush=True)
        launch_start = time.monotonic()
        code = launch.run(child_args, None, lambda report, wall: received.append(report),
                          rank_argv=[str(ENTRY_SCRIPT), *child_argv])
        wall = round(time.monotonic() - launch_start, 3)
        message = ""
        if code in (0, 1) and received:
            points += received[0]["points"]
            meta = meta or received[0]["meta"]
            code = 0
        elif code == EXIT_SKIP:
            message = "skipped (see SKIP line above)"
        else:
            message = "the launch failed (see its error above)"
            code = EXIT_ERROR if code in (0, 1) else code
        topo_runs.append(dict(entry, exit_code=code, wall_time_s=wall, message=message))
        print(f"[parity-audit] {topo.label()}: exit {code}, {wall:.1f} s", file=sys.stderr, flush=True)
    if all(t["exit_code"] == EXIT_SKIP for t in topo_runs):
        return EXIT_SKIP
    report = _final(args, known, topo_runs, points, meta or _local_meta(args), "local")
    report.wall_time_s = round(time.monotonic() - started, 3)
    _emit(report, args)
    return report.exit_code


def _final(args: ReproArgs, known, topo_runs, points, meta, launcher: str) -> AuditReport:
    known_file = "(none: --no-known)" if args.extra["no_known"] else _rel(args.extra["known"])
    return AuditReport.build(known=known, known_file=known_file, expect=args.expect, points=points, script=SCRIPT,
                             deepspeed_version=meta["deepspeed_version"], torch_version=meta["torch_version"],
                             backend=meta.get("backend", args.backend), device=meta.get("device", "cpu"),
                             launcher=launcher, mode=args.extra["mode"], topologies=topo_runs)


def _local_meta(args: ReproArgs) -> dict:
    return dict(deepspeed_version=dist_version("deepspeed") or "none", torch_version=dist_version("torch") or "none",
                backend=args.backend, device="cpu")


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _emit(report: AuditReport, args: ReproArgs) -> None:
    table = args.extra["table"]
    if table != "none":
        text = render_table(report, only_failing=(table == "failing"))
        print(text, flush=True)
        print(flush=True)
    print(render_summary(report), flush=True)
    if args.json is not None:
        report.write(args.json)


def _rejudge(args: ReproArgs, known) -> int:
    try:
        previous = AuditReport.load(args.extra["from_json"])
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    known_file = "(none: --no-known)" if args.extra["no_known"] else _rel(args.extra["known"])
    report = previous.rejudge(known, known_file, args.expect)
    _emit(report, args)
    return report.exit_code


# --------------------------------------------------------------------------- ranks


def _rank_program(args: ReproArgs, sps: list[int], known) -> launch.RankProgram:
    selection = Selection.of(args)

    def program(ctx: launch.RankContext) -> launch.RankResult:
        import torch

        from repro.audit.measure import DTYPES as TORCH_DTYPES
        from repro.audit.measure import run_point
        from repro.gradscale.oracle import expected_gradients
        from repro.gradscale.space import SMALL_AND_LARGE
        from repro.harness.env import deepspeed_version
        from repro.harness.scales import fit
        from repro.harness.topology import Topology, build_mpu

        points_out, topos_out = [], []
        for sp in sps:
            topology = Topology.create(ctx.world_size, sp)
            _reset_sp_state()
            mpu = build_mpu(topology)
            points = selection.points([Topo(ctx.world_size, sp)])
            oracle: dict[tuple[int, str], dict] = {}
            for p in points:
                key = (p.gas, p.dtype)
                if key not in oracle:
                    oracle[key] = expected_gradients(SMALL_AND_LARGE, topology, micro_steps=p.gas,
                                                     model_dtype=TORCH_DTYPES[p.dtype])
                outcome = run_point(p, SMALL_AND_LARGE, ctx.rank, ctx.device, mpu)
                rows = []
                for g in outcome.grads:
                    expected = oracle[key][g.name]
                    f = fit(g.full_grad, expected)
                    rows.append(
                        raw_row(g.name, g.numel, g.path, g.dtype, f.ratio, f.residual,
                                _max_rel_dev(g.full_grad, expected, f.ratio)))
                points_out.append(
                    raw_point(p.id, p.fields(), outcome.status, outcome.message, outcome.optimizer, outcome.seconds,
                              rows))
            topos_out.append(dict(world_size=ctx.world_size, sp=sp, dp=ctx.world_size // sp, points=len(points)))
        # Unlinked after the last collective: the mapping stays valid for the rest of the run.
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            launch.remove_shm_buffers(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], ctx.rank)
        meta = dict(deepspeed_version=deepspeed_version(), torch_version=torch.__version__, backend=ctx.backend,
                    device=ctx.device.split(":")[0])
        partial = dict(topologies=topos_out, points=[p.model_dump(mode="json") for p in points_out], meta=meta)
        if ctx.external_launcher:
            # Every rank judges its own (identical) measurements: its exit code is the verdict.
            topo_runs = [dict(t, exit_code=0, wall_time_s=None, message="") for t in topos_out]
            code = _final(args, known, topo_runs, points_out, meta, "external").exit_code
        else:
            code = 0  # the parent judges the merged report
        return launch.RankResult(code, partial if ctx.rank == 0 else None)

    return program


def _max_rel_dev(observed, expected, ratio: float) -> float:
    target = expected.double() * ratio
    dev = (observed.double() - target).abs()
    denom = target.abs().clamp_min(1e-30)
    return float((dev / denom).max()) if target.numel() else 0.0


def _reset_sp_state() -> None:
    """Forget the previous topology's sp groups before building the next one's mpu (one process
    group running several sp values under an external launcher): DeepSpeed keeps the last mpu
    an engine was given in ``deepspeed.utils.groups.mpu``, and 0.17+'s ``parallel_state_sp`` its
    groups in module globals."""
    from deepspeed.utils import groups

    groups.mpu = None
    try:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
    except ImportError:
        return
    parallel_state_sp._SEQUENCE_PARALLEL_GROUP = None
    parallel_state_sp._SEQUENCE_DATA_PARALLEL_GROUP = None


if __name__ == "__main__":
    sys.exit(main())
