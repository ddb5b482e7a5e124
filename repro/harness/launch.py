"""Start the ranks of a reproducer, or join the ranks an external launcher started.

Two ways in, one rank program:

* ``python repro/<script>.py``: this module is the parent. It hosts the rendezvous store on a
  port the kernel picked (so parallel launches never collide), starts W child processes of the
  same script, each in its own process group, and watches them against one deadline. The
  first rank that fails (a traceback, a signal, an exit before reporting) has its log printed
  with its rank, and every other rank is killed at once.
* ``torchrun`` / the ``deepspeed`` launcher: RANK, WORLD_SIZE, MASTER_ADDR... are already set;
  the process runs its rank directly, joins ``env://``, and a watchdog thread enforces the
  deadline; the launcher tears the others down when one exits non-zero.

Each rank ends with ``os._exit`` after reporting: DeepSpeed's CPU backend sometimes aborts
in C++ destructors at interpreter exit (docs/runtime-facts.md), after the work succeeded. A rank
that reported success and then died that way is counted as a success, and said so.

Modelled on torch/testing/_internal/common_distributed.py: the failing rank's traceback goes
home (a status file), the parent tears every rank down, and skips have their own exit code.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
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

from repro.harness.cli import EXIT_DOES_NOT_HOLD, EXIT_ERROR, EXIT_HOLDS, EXIT_INTERRUPTED, EXIT_SKIP, ReproArgs
from repro.harness.env import rank_environment
from repro.harness.topology import Topology
from repro.harness.files import write_json

# Set by the parent in each child's environment: the folder its status file goes to.
CHILD_DIR_VAR = "REPRO_LAUNCH_DIR"
# Set by the parent too: the launch's deadline (time.time()). Each rank's watchdog fires then, dumps
# every thread's stack into its status file and exits; the parent waits _REPORT_GRACE_S longer, so
# it reports those stacks rather than only "still running".
DEADLINE_VAR = "REPRO_LAUNCH_DEADLINE"
_REPORT_GRACE_S = 5.0
_REPORT_FILE = "report.json"
_POLL_S = 0.05
_KILL_GRACE_S = 3.0


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


@dataclasses.dataclass(frozen=True)
class RankStatus:
    """What a rank reports before it exits: written atomically, read by the parent."""

    rank: int
    status: str  # "ok" | "error" | "skip"
    exit_code: int
    message: str = ""
    traceback: str = ""
    # Wall time of the report. The ranks share one clock, so among failed ranks the earliest is
    # the cause: a peer's "connection closed" comes after the failing rank wrote its status and left.
    at: float = dataclasses.field(default_factory=time.time)

    def write(self, folder: Path) -> None:
        write_json(folder / f"rank{self.rank}.status.json", dataclasses.asdict(self), indent=None)

    @classmethod
    def read(cls, folder: Path, rank: int) -> RankStatus | None:
        path = folder / f"rank{rank}.status.json"
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What a rank program returns: its verdict's exit code and, on rank 0, the report."""

    exit_code: int
    report: dict | None = None


RankProgram = Callable[[RankContext], RankResult]
# Called once per launch with rank 0's report and the launch's wall time: by the parent for a
# local launch, by rank 0 itself under an external launcher. Prints the table, writes --json.
ReportSink = Callable[[dict, float], None]
_STARTED = time.monotonic()


def external_launcher_env() -> bool:
    """True when torchrun / the deepspeed launcher started this process as one rank."""
    return CHILD_DIR_VAR not in os.environ and "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run(args: ReproArgs, program: RankProgram, sink: ReportSink, rank_argv: list[str] | None = None) -> int:
    """Entry point of every reproducer: parent, spawned child, or externally launched rank.

    The parent starts each rank as ``rank_argv`` (script and flags); by default this process's own command line.
    """
    if CHILD_DIR_VAR in os.environ:
        _run_rank(args, program, sink, Path(os.environ[CHILD_DIR_VAR]))
    if external_launcher_env():
        _run_rank(args, program, sink, None)
    return _spawn_and_wait(args, sink, rank_argv or sys.argv)


# --------------------------------------------------------------------------- parent side


@dataclasses.dataclass
class _Child:
    rank: int
    proc: subprocess.Popen
    log: Path


def _spawn_and_wait(args: ReproArgs, sink: ReportSink, rank_argv: list[str]) -> int:
    import torch.distributed as tdist  # deferred: `--help` and bad flags need no torch

    # The parent hosts the store; the kernel picks the port, and the parent holds it until
    # every rank is gone, so two launches at once can never pick the same one.
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=args.timeout))
    workdir = Path(tempfile.mkdtemp(prefix="repro-launch-"))
    script = Path(rank_argv[0]).resolve()
    children: list[_Child] = []
    deadline = time.monotonic() + args.timeout + _REPORT_GRACE_S
    rank_deadline = f"{time.time() + args.timeout:.3f}"
    try:
        for rank in range(args.world_size):
            env = dict(os.environ)
            env.update(rank_environment(args.backend, args.world_size, args.world_size))
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world_size),
                       LOCAL_WORLD_SIZE=str(args.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), **{
                           CHILD_DIR_VAR: str(workdir),
                           DEADLINE_VAR: rank_deadline
                       })
            log = workdir / f"rank{rank}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen([sys.executable, str(script), *rank_argv[1:]], env=env, stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            children.append(_Child(rank, proc, log))
        try:
            code = _wait(children, workdir, deadline, args)
        except KeyboardInterrupt:
            # The ranks run in their own sessions and never see the terminal's SIGINT: stop them here.
            _kill_all(children)
            print(f"interrupted: stopped ranks {[c.rank for c in children]}", file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        report = workdir / _REPORT_FILE
        if code in (EXIT_HOLDS, EXIT_DOES_NOT_HOLD):
            if not report.exists():
                print("error: rank 0 finished without writing its report", file=sys.stderr)
                return EXIT_ERROR
            sink(json.loads(report.read_text()), time.monotonic() - _STARTED)
        return code
    finally:
        _kill_all(children)
        remove_shm_buffers("127.0.0.1", store.port)
        del store
        if not args.keep_logs:
            _remove_tree(workdir)


def remove_shm_buffers(addr: str, port: int | str, rank: int | None = None) -> int:
    """Remove the shared-memory segments DeepSpeed's CPU comm op left for one launch.

    ``deepspeed_shm_comm`` creates ``/dev/shm/deepspeed_*_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
    (about 64 MB a rank) at init and never unlinks them: RAM-backed, they add up over a test
    session until the machine runs out of memory. Called when the launch is over (or, under
    torchrun, by each rank as it leaves: a mapping stays valid after the unlink).
    """
    pattern = f"deepspeed_*_{addr}_{port}_{'*' if rank is None else rank}"
    removed = 0
    for path in Path("/dev/shm").glob(pattern):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed  # how many (the reduce-path benchmark records it)


def _wait(children: list[_Child], workdir: Path, deadline: float, args: ReproArgs) -> int:
    pending = {c.rank: c for c in children}
    results: dict[int, RankStatus] = {}
    while pending:
        for rank, child in list(pending.items()):
            code = child.proc.poll()
            if code is None:
                continue
            del pending[rank]
            status = RankStatus.read(workdir, rank)
            if status is not None and status.status == "skip":
                print(f"SKIP: {status.message}", flush=True)
                return EXIT_SKIP
            if status is None or status.status == "error":
                return _report_failure(children, workdir)
            if code != status.exit_code:
                # Reported, then died in teardown (the known abort at exit): the work is done.
                print(
                    f"note: rank {rank} reported exit {status.exit_code} and then exited with "
                    f"{_describe_exit(code)} during teardown; its report stands", file=sys.stderr)
            results[rank] = status
        if pending and time.monotonic() > deadline:
            stuck = sorted(pending)
            print(f"error: timeout after {args.timeout:.0f} s; ranks still running: {stuck}", file=sys.stderr)
            for rank in stuck:
                _print_log_tail(pending[rank], lines=15)
            return EXIT_ERROR
        time.sleep(_POLL_S)
    codes = {s.exit_code for s in results.values()}
    if len(codes) != 1:
        print(f"error: ranks disagree on the verdict: { {r: s.exit_code for r, s in results.items()} }",
              file=sys.stderr)
        return EXIT_ERROR
    return codes.pop()


def _report_failure(children: list[_Child], workdir: Path) -> int:
    """Print the rank that failed first, and one line for each rank that failed because of it.

    The parent notices exits in polling order, which is not the order they happened in: by the
    time it sees rank 0's "connection closed", the rank that closed it has long reported.
    A rank that died without reporting (a signal, an abort in C++) is taken as the cause; among
    the ranks that reported an error, the earliest one is.
    """
    failures: list[tuple[_Child, int | None, RankStatus | None]] = []
    for child in children:
        code = child.proc.poll()
        status = RankStatus.read(workdir, child.rank)
        if (status is not None and status.status == "error") or (status is None and code is not None):
            failures.append((child, code, status))
    # Unreported deaths first, then reported errors by time; the rank number breaks ties.
    failures.sort(key=lambda f: (f[2] is not None, f[2].at if f[2] is not None else 0.0, f[0].rank))
    (first, code, status), others = failures[0], failures[1:]
    if status is not None:
        print(f"error: rank {first.rank} failed: {status.message}", file=sys.stderr)
        print(_indent(status.traceback, f"[rank {first.rank}] "), file=sys.stderr)
    else:
        print(
            f"error: rank {first.rank} exited with {_describe_exit(code)} before reporting; "
            f"last lines of its log:", file=sys.stderr)
        _print_log_tail(first, lines=25)
    for child, code, status in others:
        why = status.message if status is not None else f"exited with {_describe_exit(code)} before reporting"
        print(f"note: rank {child.rank} failed after rank {first.rank}: {why}", file=sys.stderr)
    return EXIT_ERROR


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _print_log_tail(child: _Child, lines: int) -> None:
    try:
        tail = child.log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        tail = []
    for line in tail:
        print(f"[rank {child.rank}] {line}", file=sys.stderr)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def _kill_all(children: list[_Child]) -> None:
    """SIGTERM every rank's process group, then SIGKILL what is left: nothing outlives us."""
    alive = [c for c in children if c.proc.poll() is None]
    for c in alive:
        _signal_group(c.proc, signal.SIGTERM)
    end = time.monotonic() + _KILL_GRACE_S
    for c in alive:
        try:
            c.proc.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for c in children:
        _signal_group(c.proc, signal.SIGKILL)  # also reaps grandchildren (compiler jobs)
        try:
            c.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: Path) -> None:
    for p in sorted(path.glob("**/*"), reverse=True):
        p.unlink(missing_ok=True) if not p.is_dir() else p.rmdir()
    path.rmdir()


# --------------------------------------------------------------------------- rank side


def _run_rank(args: ReproArgs, program: RankProgram, sink: ReportSink, status_dir: Path | None) -> None:
    """Run one rank and leave the process with os._exit: this function never returns."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    os.environ.update({
        k: v
        for k, v in rank_environment(args.backend, world_size, local_world).items()
        if k not in os.environ or k == "DS_ACCELERATOR"
    })
    _start_watchdog(args.timeout, rank, status_dir)

    def finish(status: RankStatus) -> None:
        if status_dir is not None:
            status.write(status_dir)
        if status.traceback and status_dir is None:
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
        ctx = RankContext(rank, local_rank, world_size, topology, args.backend, device, args,
                          external_launcher=status_dir is None)
        result = program(ctx)
        _destroy_process_group()
        if result.report is not None:
            if status_dir is not None:
                write_json(status_dir / _REPORT_FILE, result.report, indent=None)
            else:
                sink(result.report, time.monotonic() - _STARTED)
        finish(RankStatus(rank, "ok", result.exit_code))
    except SkipRank as skip:
        finish(RankStatus(rank, "skip", EXIT_SKIP, str(skip)))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        finish(
            RankStatus(rank, "error", EXIT_ERROR, f"{type(exc).__name__}: {exc}".splitlines()[0],
                       traceback.format_exc()))


def all_threads_stack() -> str:
    """Every thread's stack now, most recent call first (``faulthandler``'s dump, one block per thread).

    The main thread is the rank's program, stuck; the others can be why (a DeepSpeed or torch
    helper thread holding a lock, a collective waiting in a communication thread). The thread that
    asks (the watchdog's timer) is marked "Current thread".
    """
    with tempfile.TemporaryFile("w+") as dump:  # faulthandler writes to a file descriptor
        faulthandler.dump_traceback(file=dump, all_threads=True)
        dump.seek(0)
        return dump.read()


def _start_watchdog(timeout: float, rank: int, status_dir: Path | None) -> threading.Timer:
    """After the deadline: every thread's stack into the status file (the parent prints it), exit 2.

    The deadline is the parent's (DEADLINE_VAR) in a local launch, else ``timeout`` from now.
    """
    wall_deadline = os.environ.get(DEADLINE_VAR) if status_dir is not None else None
    delay = max(0.0, float(wall_deadline) - time.time()) if wall_deadline else timeout

    def expire() -> None:
        msg = f"deadline of {timeout:.0f} s exceeded"
        stacks = all_threads_stack()
        if status_dir is not None:
            RankStatus(rank, "error", EXIT_ERROR, msg, stacks).write(status_dir)
        else:  # under torchrun / deepspeed: no parent of ours reads a status file; the log is the report
            print(_indent(stacks, f"[rank {rank}] "), file=sys.stderr)
        print(f"error: rank {rank}: {msg}", file=sys.stderr, flush=True)
        os._exit(EXIT_ERROR)

    timer = threading.Timer(delay, expire)
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


def _destroy_process_group() -> None:
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.barrier()
        tdist.destroy_process_group()
