#!/usr/bin/env python
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
listed in repro/known_discrepancies.toml (written up in docs/upstream-candidates/);
--expect fixed likewise with the first kind at 1.0.

Local launch (default): one launch of the ranks per topology (world size, sp), one after the
other, each running all of its points in one process group (one engine per point, destroyed
before the next); the parent merges the reports. --world-size and --sp restrict the topologies.
Under torchrun / the deepspeed launcher: the launcher's world size only, every sp that divides
it (or --sp), in the one process group.

--timeout is the deadline of the whole audit: each launch gets what is left of it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.harness import launch  # noqa: E402
from repro.audit_expect import DEFAULT_KNOWN_FILE, load_known  # noqa: E402
from repro.audit_report import AuditReport, raw_point, raw_row, render_summary, render_table  # noqa: E402
from repro.audit_space import (DP_VALUES, DTYPES, GAS_VALUES, MODES, SP_VALUES, STAGES, Topo, group_by_topology,  # noqa: E402
                               select, topologies)
from repro.harness.cli import EXIT_ERROR, EXIT_SKIP, ReproArgs, UsageError, build_parser, gpu_count, parse  # noqa: E402

SCRIPT = "parity_audit"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TIMEOUT_S = 3600.0
# A launch with less than this left of the deadline is not started.
MIN_LAUNCH_S = 20.0


def _add_arguments(parser) -> None:
    parser.set_defaults(timeout=DEFAULT_TIMEOUT_S)
    parser.add_argument("--mode", choices=MODES, default="quick",
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
                        help="the known-discrepancy file (default repro/known_discrepancies.toml)")
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
        for flag, values in (("--stage", self.stages), ("--dtype", self.dtypes), ("--gas", self.gas),
                             ("--point", self.patterns)):
            for v in values or ():
                out += [flag, str(v)]
        return out


# --------------------------------------------------------------------------- entry


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(__doc__.split("\n\n")[0], prog="parity_audit.py")
    _add_arguments(parser)
    # Which of --world-size, --sp, --backend were given, as argparse reads argv (abbreviations such
    # as --world 4 included): unset, the audit runs every topology of its space.
    defaults = {name: parser.get_default(name) for name in ("world_size", "sp", "backend")}
    parser.set_defaults(world_size=None, sp=None, backend=None)
    given = parser.parse_args(argv)
    parser.set_defaults(**defaults)
    explicit_ws, explicit_sp = given.world_size is not None, given.sp is not None
    backend_choice = given.backend or "auto"
    parse_argv = list(argv)
    if not explicit_sp:
        parse_argv += ["--sp", "1"]  # validated later per topology; the shared parser wants one
    try:
        args = parse(parser, parse_argv)
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
    if launch.external_launcher_env():
        world = args.world_size
        sps = [args.sp] if explicit_sp else [t.sp for t in topologies([world])]
        topos = [Topo(world, sp) for sp in sps if Topo(world, sp) in topologies([world])]
        if not topos:
            print(f"error: world size {world} (sp {sps}) is outside the audit's space "
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
        print(f"error: no topology of the audit's space has world size {args.world_size if explicit_ws else 'any'} "
              f"and sp {args.sp if explicit_sp else 'any'} (sp in {SP_VALUES}, dp in {DP_VALUES}, "
              f"at most 4 ranks)", file=sys.stderr)
        return EXIT_ERROR
    if args.extra["list"]:
        return _list(selection, topos)
    return _parent(args, selection, topos, known, backend_choice)


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


def _parent(args: ReproArgs, selection: Selection, topos, known, backend_choice: str) -> int:
    started = time.monotonic()
    deadline = started + args.timeout
    groups = group_by_topology(selection.points(topos))
    if not groups:
        print("error: the filters select no point", file=sys.stderr)
        return EXIT_ERROR
    script = str(Path(__file__).resolve())
    topo_runs, points, meta = [], [], {}
    for topo, topo_points in groups.items():
        left = deadline - time.monotonic()
        entry = dict(world_size=topo.world_size, sp=topo.sp, dp=topo.dp, points=len(topo_points))
        if left < MIN_LAUNCH_S:
            topo_runs.append(dict(entry, exit_code=EXIT_ERROR, wall_time_s=0.0,
                                  message=f"not started: {left:.0f} s left of the {args.timeout:.0f} s deadline"))
            continue
        backend = backend_choice if backend_choice != "auto" else (
            "nccl" if gpu_count() >= topo.world_size else "gloo")
        child_args = dataclasses.replace(args, world_size=topo.world_size, sp=topo.sp, timeout=left, backend=backend,
                                         json=None)
        child_argv = ["--world-size", str(topo.world_size), "--sp", str(topo.sp), "--backend", backend, "--expect",
                      args.expect, "--timeout", f"{left:.1f}", "--known", str(args.extra["known"]),
                      *(["--no-known"] if args.extra["no_known"] else []),
                      *selection.argv(), *(["--keep-logs"] if args.keep_logs else [])]
        received: list[dict] = []
        print(f"[parity-audit] launch {topo.label()} (world {topo.world_size}, {backend}): {len(topo_points)} points, "
              f"{left:.0f} s left", file=sys.stderr, flush=True)
        launch_start = time.monotonic()
        saved_argv = sys.argv
        sys.argv = [script, *child_argv]
        try:
            code = launch.run(child_args, None, lambda report, wall: received.append(report))
        finally:
            sys.argv = saved_argv
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
    return AuditReport.build(known=known, known_file=known_file, expect=args.expect, points=points,
                             script=SCRIPT, deepspeed_version=meta["deepspeed_version"],
                             torch_version=meta["torch_version"], backend=meta.get("backend", args.backend),
                             device=meta.get("device", "cpu"), launcher=launcher, mode=args.extra["mode"],
                             topologies=topo_runs)


def _local_meta(args: ReproArgs) -> dict:
    def version(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "none"

    return dict(deepspeed_version=version("deepspeed"), torch_version=version("torch"), backend=args.backend,
                device="cpu")


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

        from repro.audit_measure import DTYPES as TORCH_DTYPES
        from repro.audit_measure import run_point
        from repro.harness.env import deepspeed_version
        from repro.model import SMALL_AND_LARGE
        from repro.oracle import expected_gradients
        from repro.harness.topology import Topology, build_mpu
        from repro.verdict import compare

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
                    cmp = compare(g.full_grad, expected)
                    rows.append(raw_row(g.name, g.numel, g.path, g.dtype, cmp.ratio, cmp.residual,
                                        _max_rel_dev(g.full_grad, expected, cmp.ratio)))
                points_out.append(raw_point(p.id, p.fields(), outcome.status, outcome.message, outcome.optimizer,
                                            outcome.seconds, rows))
            topos_out.append(dict(world_size=ctx.world_size, sp=sp, dp=ctx.world_size // sp, points=len(points)))
        # Unlinked after the last collective: the mapping stays valid for the rest of the run.
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            launch.remove_shm_buffers(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], ctx.rank)
        meta = dict(deepspeed_version=deepspeed_version(), torch_version=torch.__version__, backend=ctx.backend,
                    device=ctx.device.split(":")[0])
        partial = dict(topologies=topos_out, points=points_out, meta=meta)
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
