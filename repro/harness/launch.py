"""Start the ranks of a reproducer (local launch) or join those an external launcher (torchrun, deepspeed)
started: one rank program, one deadline, every rank's process group torn down, the first failing rank named."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Callable

from repro.harness import exit_codes
from repro.harness.cli import ReproArgs
from repro.harness.env import dist_version, rank_environment
from repro.harness.files import write_json
from repro.harness.topology import Topology

# Not torch.distributed.elastic's start_processes: its wait() stops every rank at the first nonzero exit (1 and 77
# are verdicts here) and orders failures by whole-second timestamps (a rank 0 "Connection closed" ties rank 1's
# cause); it leaves the children of an exited rank running.
CHILD_DIR_VAR = "REPRO_LAUNCH_DIR"  # set by the parent for each child: where its status file goes
# The launch's deadline (time.time()), for the ranks' watchdogs; the parent waits _REPORT_GRACE_S longer.
DEADLINE_VAR = "REPRO_LAUNCH_DEADLINE"
PARENT_VAR = "REPRO_LAUNCH_PARENT"  # the parent's pid: a rank whose parent is gone exits
_REPORT_GRACE_S = 5.0
_REPORT_FILE = "report.json"
_STARTED = time.monotonic()


class SkipRank(Exception):
    """Raised by a rank program that cannot run here; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    topology: Topology
    backend: str
    device: str  # "cpu" or "cuda:N"
    args: ReproArgs
    external_launcher: bool


def launch_fields(ctx: RankContext, script: str) -> dict:
    """The report fields every family takes from the launch (python_version: the model's default)."""
    import torch

    return dict(script=script, deepspeed_version=dist_version("deepspeed") or "none", torch_version=torch.__version__,
                backend=ctx.backend, device=ctx.device.split(":")[0],
                launcher="external" if ctx.external_launcher else "local", world_size=ctx.world_size,
                sp=ctx.topology.sp, dp=ctx.topology.dp, expect=ctx.args.expect)


@dataclasses.dataclass(frozen=True)
class RankStatus:
    """What a rank reports before it exits: written atomically, read by the parent."""

    rank: int
    status: str  # "ok" | "error" | "skip"
    exit_code: int
    message: str = ""
    traceback: str = ""
    at: float = dataclasses.field(default_factory=time.time)  # one clock: the earliest failure is the cause

    def write(self, folder: Path) -> None:
        write_json(folder / f"rank{self.rank}.status.json", dataclasses.asdict(self), indent=None)

    @classmethod
    def read(cls, folder: Path, rank: int) -> RankStatus | None:
        path = folder / f"rank{rank}.status.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What a rank program returns: its verdict's exit code and, on rank 0, the report."""

    exit_code: int
    report: dict | None = None


RankProgram = Callable[[RankContext], RankResult]
# Called once per launch with rank 0's report and the wall time: by the parent, or by rank 0 under torchrun.
ReportSink = Callable[[dict, float], None]


def external_launcher_env() -> bool:
    """True when torchrun / the deepspeed launcher started this process as one rank."""
    return CHILD_DIR_VAR not in os.environ and "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run(args: ReproArgs, program: RankProgram, sink: ReportSink, rank_argv: list[str] | None = None) -> int:
    """Entry point of every reproducer: parent, spawned child, or externally launched rank; the parent starts each
    rank as ``rank_argv`` (script and flags), by default this process's command line."""
    if CHILD_DIR_VAR in os.environ:
        _run_rank(args, program, sink, Path(os.environ[CHILD_DIR_VAR]))
    if external_launcher_env():
        _run_rank(args, program, sink, None)
    return _spawn_and_wait(args, sink, rank_argv or sys.argv)


@dataclasses.dataclass
class _Child:
    rank: int
    proc: subprocess.Popen
    log: Path


def _spawn_and_wait(args: ReproArgs, sink: ReportSink, rank_argv: list[str]) -> int:
    import torch.distributed as tdist  # deferred: `--help` and bad flags need no torch

    # The kernel picks the store's port and the parent holds it to the end: parallel launches never collide.
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=args.timeout))
    workdir = Path(tempfile.mkdtemp(prefix="repro-launch-"))
    n = str(args.world_size)
    env = dict(
        os.environ, **rank_environment(args.backend, args.world_size, args.world_size), WORLD_SIZE=n,
        LOCAL_WORLD_SIZE=n, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), **{
            CHILD_DIR_VAR: str(workdir),
            DEADLINE_VAR: f"{time.time() + args.timeout:.3f}",
            PARENT_VAR: str(os.getpid())
        })
    deadline = time.monotonic() + args.timeout + _REPORT_GRACE_S
    children: list[_Child] = []
    # SIGTERM (a job's deadline, a CI cancel) takes Ctrl-C's path: the ranks, in their own sessions, see neither.
    previous = (signal.signal(signal.SIGTERM, _interrupt)
                if threading.current_thread() is threading.main_thread() else None)
    try:
        for rank in range(args.world_size):
            log = workdir / f"rank{rank}.log"
            with open(log, "wb") as out:  # its own session: kill_groups takes the rank and its children down
                proc = subprocess.Popen(
                    [sys.executable, str(Path(rank_argv[0]).resolve()), *rank_argv[1:]], env=env | {
                        "RANK": str(rank),
                        "LOCAL_RANK": str(rank)
                    }, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            children.append(_Child(rank, proc, log))
        try:
            code = _wait(children, workdir, deadline, args)
        except KeyboardInterrupt:  # the ranks' own sessions never see the terminal's SIGINT: stop them here
            kill_groups([c.proc for c in children])
            print(f"interrupted: stopped ranks {[c.rank for c in children]}", file=sys.stderr, flush=True)
            return exit_codes.INTERRUPTED
        if code in (exit_codes.HOLDS, exit_codes.DOES_NOT_HOLD):
            if not (workdir / _REPORT_FILE).exists():
                print("error: rank 0 finished without writing its report", file=sys.stderr)
                return exit_codes.ERROR
            sink(json.loads((workdir / _REPORT_FILE).read_text()), time.monotonic() - _STARTED)
        return code
    finally:
        kill_groups([c.proc for c in children])
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        remove_shm_buffers("127.0.0.1", store.port)
        del store
        if not args.keep_logs:
            shutil.rmtree(workdir)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def kill_groups(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """SIGTERM the process group of each live process (started with start_new_session), SIGKILL every group after
    ``grace_s``: the processes and their children (compiler jobs) all go, even if a second Ctrl-C cuts the grace."""

    def signal_and_wait(sig: signal.Signals, wait_s: float) -> None:
        for proc in procs:
            if sig == signal.SIGKILL or proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        end = time.monotonic() + wait_s
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))

    try:
        signal_and_wait(signal.SIGTERM, grace_s)
    finally:
        signal_and_wait(signal.SIGKILL, 5.0)


def remove_shm_buffers(addr: str, port: int | str, rank: int | None = None) -> int:
    """Remove the /dev/shm segments (~64 MB a rank) DeepSpeed's CPU comm op left for one launch and never unlinks."""
    removed = 0
    for path in Path("/dev/shm").glob(f"deepspeed_*_{addr}_{port}_{'*' if rank is None else rank}"):
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
    return removed  # how many (the reduce-path benchmark records it)


def _wait(children: list[_Child], workdir: Path, deadline: float, args: ReproArgs) -> int:
    pending = {c.rank: c for c in children}
    results: dict[int, RankStatus] = {}
    while pending:
        for rank, child in list(pending.items()):
            if (code := child.proc.poll()) is None:
                continue
            del pending[rank]
            status = RankStatus.read(workdir, rank)
            if status is not None and status.status == "skip":
                print(f"SKIP: {status.message}", flush=True)
                return exit_codes.SKIPPED
            if status is None or status.status == "error":
                return _report_failure(children, workdir)
            if code != status.exit_code:  # reported, then died in teardown (the known abort at exit): work done
                print(
                    f"note: rank {rank} reported exit {status.exit_code} and then exited with "
                    f"{_describe_exit(code)} during teardown; its report stands", file=sys.stderr)
            results[rank] = status
        if pending and time.monotonic() > deadline:
            print(f"error: deadline of {args.timeout:.0f} s exceeded; ranks still running: {sorted(pending)}",
                  file=sys.stderr)
            for child in pending.values():
                _print_log_tail(child, lines=15)
            return exit_codes.ERROR
        time.sleep(0.05)
    codes = {r: s.exit_code for r, s in results.items()}
    if len(set(codes.values())) != 1:
        print(f"error: ranks disagree on the verdict: {codes}", file=sys.stderr)
        return exit_codes.ERROR
    return codes[0]


def _report_failure(children: list[_Child], workdir: Path) -> int:
    """Print the rank that failed first (one that died unreported, else the earliest report), and a line for
    each rank that failed after it: exits are noticed in polling order, not in the order they happened."""
    failures = []
    for child in children:
        code, status = child.proc.poll(), RankStatus.read(workdir, child.rank)
        if (status is not None and status.status == "error") or (status is None and code is not None):
            failures.append((child, code, status))
    # Unreported deaths first, then reported errors by time; the rank number breaks ties.
    failures.sort(key=lambda f: (f[2] is not None, f[2].at if f[2] is not None else 0.0, f[0].rank))
    (first, code, status), others = failures[0], failures[1:]
    if status is not None:
        print(f"error: rank {first.rank} failed: {status.message}", file=sys.stderr)
        print(_indent(status.traceback, f"[rank {first.rank}] "), file=sys.stderr)
    else:
        print(f"error: rank {first.rank} exited with {_describe_exit(code)} before reporting; last lines of its log:",
              file=sys.stderr)
        _print_log_tail(first, lines=25)
    for child, code, status in others:
        why = status.message if status is not None else f"exited with {_describe_exit(code)} before reporting"
        print(f"note: rank {child.rank} failed after rank {first.rank}: {why}", file=sys.stderr)
    return exit_codes.ERROR


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    with contextlib.suppress(ValueError):
        return f"signal {signal.Signals(-code).name}"
    return f"signal {-code}"


def _print_log_tail(child: _Child, lines: int) -> None:
    with contextlib.suppress(OSError):
        for line in child.log.read_text(errors="replace").splitlines()[-lines:]:
            print(f"[rank {child.rank}] {line}", file=sys.stderr)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def _run_rank(args: ReproArgs, program: RankProgram, sink: ReportSink, status_dir: Path | None) -> None:
    """Run one rank and leave the process with os._exit: this function never returns."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    os.environ.update({
        k: v
        for k, v in rank_environment(args.backend, world_size, local_world).items()
        if k not in os.environ or k == "DS_ACCELERATOR"
    })
    if status_dir is not None:
        _die_with_parent()
    _start_watchdog(args.timeout, rank, status_dir)

    def finish(status: RankStatus) -> None:
        if status_dir is not None:
            status.write(status_dir)
        elif status.traceback:
            print(_indent(status.traceback, f"[rank {rank}] "), file=sys.stderr)
        if status.status == "skip" and (rank == 0 or status_dir is None):
            print(f"SKIP: {status.message}", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        if status_dir is None and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            remove_shm_buffers(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], rank)
        os._exit(status.exit_code)

    try:
        if world_size != args.world_size and status_dir is None:
            # Under torchrun the launcher's world size is the truth; --world-size is for local launches.
            args = dataclasses.replace(args, world_size=world_size)
        topology = Topology.create(world_size, args.sp)
        device = _init_process_group(args, rank, world_size, local_rank, status_dir is not None)
        result = program(
            RankContext(rank, local_rank, world_size, topology, args.backend, device, args,
                        external_launcher=status_dir is None))
        import torch.distributed as tdist

        if tdist.is_initialized():
            tdist.barrier()
            tdist.destroy_process_group()
        if result.report is not None and status_dir is not None:
            write_json(status_dir / _REPORT_FILE, result.report, indent=None)
        elif result.report is not None:
            sink(result.report, time.monotonic() - _STARTED)
        finish(RankStatus(rank, "ok", result.exit_code))
    except SkipRank as skip:
        finish(RankStatus(rank, "skip", exit_codes.SKIPPED, str(skip)))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        finish(
            RankStatus(rank, "error", exit_codes.ERROR, f"{type(exc).__name__}: {exc}".splitlines()[0],
                       traceback.format_exc()))


def _die_with_parent() -> None:
    """A spawned rank goes with its parent, even one killed by SIGKILL, whose ``finally`` never runs."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != int(os.environ[PARENT_VAR]):  # it died before prctl
            os._exit(exit_codes.ERROR)


def all_threads_stack() -> str:
    """Every thread's stack now (``faulthandler``'s dump): the stuck program's, and its helper threads'."""
    with tempfile.TemporaryFile("w+") as dump:  # faulthandler writes to a file descriptor
        faulthandler.dump_traceback(file=dump, all_threads=True)
        dump.seek(0)
        return dump.read()


def _start_watchdog(timeout: float, rank: int, status_dir: Path | None) -> threading.Timer:
    """At the deadline (the parent's DEADLINE_VAR, else ``timeout`` from now): every thread's stack into the
    status file (the parent prints it), or to stderr under torchrun; exit 2."""
    wall_deadline = os.environ.get(DEADLINE_VAR) if status_dir is not None else None

    def expire() -> None:
        msg = f"deadline of {timeout:.0f} s exceeded"
        if status_dir is not None:
            RankStatus(rank, "error", exit_codes.ERROR, msg, all_threads_stack()).write(status_dir)
        else:  # under torchrun / deepspeed no parent of ours reads a status file: the log is the report
            print(_indent(all_threads_stack(), f"[rank {rank}] "), file=sys.stderr)
        print(f"error: rank {rank}: {msg}", file=sys.stderr, flush=True)
        os._exit(exit_codes.ERROR)

    timer = threading.Timer(max(0.0, float(wall_deadline) - time.time()) if wall_deadline else timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


def _init_process_group(args: ReproArgs, rank: int, world_size: int, local_rank: int, spawned: bool) -> str:
    import torch
    import torch.distributed as tdist

    device = "cpu"
    if args.backend == "nccl":
        if torch.cuda.device_count() <= local_rank:
            raise SkipRank(f"nccl needs one GPU per rank: local rank {local_rank} has none "
                           f"({torch.cuda.device_count()} visible)")
        torch.cuda.set_device(local_rank)  #ignore-cuda
        device = f"cuda:{local_rank}"
    timeout = timedelta(seconds=args.timeout)
    if spawned:
        store = tdist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                               timeout=timeout)
        tdist.init_process_group(args.backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    else:
        tdist.init_process_group(args.backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    import deepspeed

    # DeepSpeed wraps the group that is already up (and builds its CPU comm op on first use).
    deepspeed.init_distributed(dist_backend=args.backend)
    return device
