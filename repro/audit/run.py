"""Gradient-scale parity audit: every ZeRO configuration point against one plain-torch oracle."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from repro.audit.expect import DEFAULT_KNOWN_FILE, load_known
from repro.audit.report import AuditReport, render_summary
from repro.audit.space import (DP_VALUES, DTYPES, GAS_VALUES, MODES, SP_VALUES, STAGES, group_by_topology, select,
                               topologies)
from repro.harness import exit_codes, launch
from repro.harness.topology import Topology
from repro.harness.env import dist_version
from repro.harness.files import relative_to
from repro.harness.cli import ReproArgs, UsageError, build_parser, interruptible, resolve_backend, validate

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
    # Defaults of None tell unset --world-size/--sp/--backend (every topology; a backend each) from given ones.
    parser.add_argument(
        "--world-size", type=int, help="only the topologies of this world size (default: every one, "
        "up to 4 ranks; under torchrun its world size)")
    parser.add_argument(
        "--sp", type=int, help="only the topologies of this sp (default: every one of "
        f"{', '.join(map(str, SP_VALUES))} that divides the world size)")
    parser.add_argument(
        "--backend", choices=["gloo", "nccl", "auto"], help="gloo: CPU ranks; nccl: one GPU per rank; "
        "auto (default): for each topology, nccl when there is a GPU for every rank, else gloo")
    parser.add_argument(
        "--mode", choices=MODES, default="quick", help="quick: a covering subset (every factor "
        "level, every reduce path); full: the whole space (default quick)")
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


FILTERS = ("stage", "dtype", "gas", "point")  # the repeatable selection flags (each flag's dest is its name)


def _points(args: ReproArgs, topos) -> list:
    return select(args.extra["mode"], topos, *(args.extra[f] for f in FILTERS))


def _selection_argv(args: ReproArgs) -> list[str]:
    return ["--mode", args.extra["mode"]
            ] + [x for f in FILTERS for v in args.extra[f] or () for x in (f"--{f}", str(v))]


def main(argv: list[str] | None = None) -> int:
    """The audit's entry: ``argv`` (default ``sys.argv[1:]``) is parsed once, here."""
    parser = build_parser(__doc__.split("\n\n")[0], prog="parity_audit.py", expect_help=EXPECT_HELP)
    _add_arguments(parser)
    try:
        args = _repro_args(parser.parse_args(argv))
        known = [] if args.extra["no_known"] else load_known(args.extra["known"], root=REPO_ROOT)
        previous = None if args.extra["from_json"] is None else AuditReport.load(args.extra["from_json"])
    except (UsageError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return exit_codes.ERROR
    if previous is not None:  # --from-json: judge again, run nothing
        return _emit(previous.rejudge(known, _known_file(args), args.expect), args)
    if launch.CHILD_DIR_VAR in os.environ:  # a rank this audit spawned for one topology
        return launch.run(args, _rank_program(args, [args.sp], known), lambda report, wall: None)
    external = launch.external_launcher_env()
    world = args.world_size if args.extra["world_size_given"] or external else None  # None: every one
    sp = args.sp if args.extra["sp_given"] else None
    topos = topologies(None if world is None else [world], None if sp is None else [sp])
    if not topos:
        print(
            f"error: no topology of the audit's space has world size {world or 'any'} and sp {sp or 'any'} (sp in "
            f"{SP_VALUES}, dp in {DP_VALUES}, at most 4 ranks)", file=sys.stderr)
        return exit_codes.ERROR
    if args.extra["list"]:
        return _list(args, topos)
    if not external:
        return interruptible(_parent, args, topos, known)

    def sink(partial: dict, wall: float) -> None:
        _emit(_final(args, known, partial["topologies"], partial["points"], partial["meta"], wall), args)

    return launch.run(args, _rank_program(args, [t.sp for t in topos], known), sink)


def _repro_args(ns: argparse.Namespace) -> ReproArgs:
    """The parsed flags as ``ReproArgs`` (``cli.validate``); ``extra`` records whether --world-size and --sp were
    given and the --backend choice; unset, the checks see values every topology accepts (sp 1, world size sp)."""
    given = dict(world_size_given=ns.world_size is not None, sp_given=ns.sp is not None, backend_choice=ns.backend
                 or "auto")
    sp = ns.sp if given["sp_given"] else 1
    world_size = ns.world_size if given["world_size_given"] else sp
    return validate(
        argparse.Namespace(**dict(vars(ns), world_size=world_size, sp=sp, backend=given["backend_choice"], **given)))


def _list(args: ReproArgs, topos) -> int:
    groups = group_by_topology(_points(args, topos))
    for topo, points in groups.items():
        print(f"# world {topo.world_size}, {topo.label()}: {len(points)} points", *(p.id for p in points), sep="\n")
    print(f"# {sum(map(len, groups.values()))} points in {len(groups)} launches ({args.extra['mode']})")
    return 0


def _parent(args: ReproArgs, topos, known) -> int:
    started = time.monotonic()
    deadline = started + args.timeout
    groups = group_by_topology(_points(args, topos))
    if not groups:
        print("error: the filters select no point", file=sys.stderr)
        return exit_codes.ERROR
    topo_runs, points, meta = [], [], {}
    for topo, topo_points in groups.items():
        left = deadline - time.monotonic()
        if left < MIN_LAUNCH_S:
            topo_runs.append(
                _topology_run(topo, topo_points, exit_codes.ERROR, 0.0,
                              f"not started: {left:.0f} s left of the {args.timeout:.0f} s deadline"))
            continue
        backend = resolve_backend(args.extra["backend_choice"], topo.world_size)
        child_args = dataclasses.replace(args, world_size=topo.world_size, sp=topo.sp, timeout=left, backend=backend,
                                         json=None)
        child_argv = [
            "--world-size", f"{topo.world_size}", "--sp", f"{topo.sp}", "--backend", backend, "--expect", args.expect,
            "--timeout", f"{left:.1f}", "--known", f"{args.extra['known']}", *["--no-known"] * args.extra["no_known"],
            *_selection_argv(args), *["--keep-logs"] * args.keep_logs
        ]
        received: list[dict] = []
        print(
            f"[parity-audit] launch {topo.label()} (world {topo.world_size}, {backend}): {len(topo_points)} points, "
            f"{left:.0f} s left", file=sys.stderr, flush=True)
        launch_start = time.monotonic()
        code = launch.run(child_args, None, lambda report, wall: received.append(report),
                          rank_argv=[str(ENTRY_SCRIPT), *child_argv])
        if code == exit_codes.INTERRUPTED:  # Ctrl-C or SIGTERM: the launch stopped its ranks; no next topology starts
            return code
        wall = round(time.monotonic() - launch_start, 3)
        message = ""
        if code in (0, 1) and received:
            points += received[0]["points"]
            meta = meta or received[0]["meta"]
            code = 0
        elif code == exit_codes.SKIPPED:
            message = "skipped (see SKIP line above)"
        else:
            message = "the launch failed (see its error above)"
            code = exit_codes.ERROR if code in (0, 1) else code
        topo_runs.append(_topology_run(topo, topo_points, code, wall, message))
        print(f"[parity-audit] {topo.label()}: exit {code}, {wall:.1f} s", file=sys.stderr, flush=True)
    if all(t["exit_code"] == exit_codes.SKIPPED for t in topo_runs):
        return exit_codes.SKIPPED
    local_meta = dict(deepspeed_version=dist_version("deepspeed") or "none", torch_version=dist_version("torch")
                      or "none", backend=args.backend, device="cpu")
    return _emit(_final(args, known, topo_runs, points, meta or local_meta, time.monotonic() - started), args)


def _topology_run(topo: Topology, points: list, exit_code: int = 0, wall_time_s: float | None = None,
                  message: str = "") -> dict:
    """A launch's ``TopologyRun`` (by default a rank's, under an external launcher: no outcome of its own)."""
    return dict(world_size=topo.world_size, sp=topo.sp, dp=topo.dp, points=len(points), exit_code=exit_code,
                wall_time_s=wall_time_s, message=message)


def _known_file(args: ReproArgs) -> str:
    return "(none: --no-known)" if args.extra["no_known"] else relative_to(str(args.extra["known"]), REPO_ROOT)


def _final(args: ReproArgs, known, topo_runs, points, meta, wall: float | None = None) -> AuditReport:
    launcher = "external" if launch.external_launcher_env() else "local"
    return AuditReport.build(known=known, known_file=_known_file(args), expect=args.expect, points=points,
                             script=SCRIPT, launcher=launcher, mode=args.extra["mode"], topologies=topo_runs,
                             wall_time_s=None if wall is None else round(wall, 3), **meta)


def _emit(report: AuditReport, args: ReproArgs) -> int:
    """Print the table and the summary, write the JSON; the report's exit code."""
    if (table := args.extra["table"]) != "none":
        print(report.table(only_failing=(table == "failing")) + "\n", flush=True)
    print(render_summary(report), flush=True)
    if args.json is not None:
        report.write(args.json)
    return report.exit_code


def _rank_program(args: ReproArgs, sps: list[int], known) -> launch.RankProgram:

    def program(ctx: launch.RankContext) -> launch.RankResult:
        from repro.audit.measure import run_topology

        points_out, topos_out = [], []
        for topo in (Topology.create(ctx.world_size, sp) for sp in sps):
            points = _points(args, [topo])
            points_out += run_topology(points, topo, ctx.rank, ctx.device)
            topos_out.append(_topology_run(topo, points))
        # Unlinked after the last collective: the mapping stays valid for the rest of the run.
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            launch.remove_shm_buffers(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], ctx.rank)
        fields = launch.launch_fields(ctx, SCRIPT)  # the four the audit takes from its ranks; _final adds the rest
        meta = {k: fields[k] for k in ("deepspeed_version", "torch_version", "backend", "device")}
        partial = dict(topologies=topos_out, points=[p.model_dump(mode="json") for p in points_out], meta=meta)
        # Under an external launcher every rank judges its own (identical) measurements: its exit code is the
        # verdict; a local launch's parent judges the merged report.
        code = _final(args, known, topos_out, points_out, meta).exit_code if ctx.external_launcher else 0
        return launch.RankResult(code, partial if ctx.rank == 0 else None)

    return program


if __name__ == "__main__":
    sys.exit(main())
