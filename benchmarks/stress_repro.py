#!/usr/bin/env python
"""Stress and faults: five faults, each to end with its documented exit code, then many launches of each
reproducer (2 ranks, 4 ranks sp=2 x dp=2, torchrun), counted for false reds, hangs and leaked processes or
/dev/shm segments. Writes results/benchmarks/stress_repro.json (or --out). More: docs/code/benchmarks.md"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from _common import ROOT, default_python, environment, write_result  # noqa: E402
from patch_and_test.review.benchmark_reports import Counts, Fault, KindCounts, Launch, StressRepro  # noqa: E402
from repro.gradscale.space import SCRIPTS  # noqa: E402
from repro.harness.launch import kill_groups  # noqa: E402

TAG_VAR = "ZERO3_SP_STRESS_TAG"
REPRO = ROOT / "repro"
TWO_RANK = tuple(f"{s}.py" for s in SCRIPTS)
DEADLINE_S = 300.0  # the reproducers' own default --timeout
MARGIN_S = 60.0  # on top of it before the stress loop calls a launch hung


def shm_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("deepspeed_*")}


def tagged_processes(tag: str) -> dict[int, tuple[str, dict[str, str]]]:
    """pid -> (command line, environment) of every live (not zombie) process whose environment carries ``tag``."""
    found, marker = {}, f"{TAG_VAR}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Polled every 0.1-0.2 s during launches: only a tagged process's environment is decoded.
            raw = (entry / "environ").read_bytes().split(b"\0")
            if marker in raw and "\nState:\tZ" not in (entry / "status").read_text():
                env = dict(i.decode(errors="replace").split("=", 1) for i in raw if b"=" in i)
                found[int(entry.name)] = ((entry / "cmdline").read_bytes().replace(
                    b"\0", b" ").decode(errors="replace").strip(), env)
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def _new_shm(before: set[str], ports: set[str]) -> list[str]:
    # deepspeed_<kind>_<MASTER_ADDR>_<MASTER_PORT>_<rank>: other jobs' segments are not this launch's
    return sorted(n for n in shm_segments() - before if any(f"_{port}_" in n for port in ports))


def leftovers(tag: str, shm_before: set[str], ports: set[str], grace_s: float = 5.0) -> tuple[list[str], list[str]]:
    """What a finished launch left behind, after a short grace for the kernel to reap."""
    end = time.monotonic() + grace_s
    while True:
        procs = [f"{pid} {cmd[:120]}" for pid, (cmd, _) in tagged_processes(tag).items()]
        shm = _new_shm(shm_before, ports)
        if (not procs and not shm) or time.monotonic() > end:
            return procs, shm
        time.sleep(0.2)


def _cleanup(tag: str, shm_new: list[str]) -> None:
    """Leave the machine as it was for the next launch (what leaked is already counted)."""
    for pid in tagged_processes(tag):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for name in shm_new:
        Path("/dev/shm", name).unlink(missing_ok=True)


def launch(kind: str, argv: list[str], expected: int, *, fault=None, timeout: float = DEADLINE_S + MARGIN_S) -> Launch:
    """One launch with a fresh tag; ``fault(proc, tag)`` runs beside it (it may signal the launch)."""
    tag = uuid.uuid4().hex
    shm_before = shm_segments()
    start = time.monotonic()
    # SIGINT's default action restored: a shell's background job (nohup ... &) inherits it ignored.
    proc = subprocess.Popen(argv, cwd=ROOT, env=os.environ | {TAG_VAR: tag}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ports: set[str] = set()
    stop = threading.Event()

    def watch() -> None:  # the ranks' MASTER_PORTs while they live: DeepSpeed names its /dev/shm segments after them
        while not stop.is_set():
            ports.update({env.get("MASTER_PORT", "") for _, env in tagged_processes(tag).values()} - {""})
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    code: int | None = None
    try:
        if fault is not None:
            fault(proc, tag)
        _, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        kill_groups([proc], grace_s=0)
        _, err = proc.communicate()
    except BaseException:  # the stress loop itself stopped (Ctrl-C, SIGTERM): this launch and its ranks go too
        stop.set()
        _cleanup(tag, _new_shm(shm_before, ports))
        raise
    wall = time.monotonic() - start
    stop.set()
    watcher.join()
    procs, shm = leftovers(tag, shm_before, ports)
    _cleanup(tag, shm)
    return Launch(kind=kind, script=next((Path(a).name for a in argv if a.endswith(".py")), "?"), exit_code=code,
                  expected=expected, wall_s=round(wall, 2), leaked_processes=procs, leaked_shm=shm,
                  teardown_aborts_absorbed=sum("during teardown" in line
                                               for line in err.splitlines()), stderr_tail=err[-1500:])


def _wait_until_running(proc: subprocess.Popen, tag: str, limit_s: float = 240.0) -> dict[int, int]:
    """rank -> pid of the launch's ranks, once rank 1's log shows DeepSpeed's engine up: the reproducer then builds
    one engine per config and reduces its gradients, so a fault a moment later lands mid-run, among collectives."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end and proc.poll() is None:
        ranks = {
            int(env["RANK"]): pid
            for pid, (_, env) in tagged_processes(tag).items()
            if pid != proc.pid and "RANK" in env and "LOCAL_RANK" in env
        }
        if len(ranks) >= 2:
            break
        time.sleep(0.1)
    else:
        return {}
    if 1 not in ranks:
        return ranks
    try:
        log = Path(os.readlink(f"/proc/{ranks[1]}/fd/1"))
    except OSError:
        return ranks
    end = time.monotonic() + limit_s  # the log wait has its own budget
    while time.monotonic() < end and proc.poll() is None:
        try:
            if "DeepSpeed" in log.read_text(errors="replace"):
                time.sleep(1.0)
                return ranks
        except OSError:
            return ranks
        time.sleep(0.1)
    return ranks


def fault_kill_rank(proc: subprocess.Popen, tag: str) -> None:
    """SIGKILL rank 1 mid-run."""
    if 1 in (ranks := _wait_until_running(proc, tag)) and proc.poll() is None:
        os.kill(ranks[1], signal.SIGKILL)


def fault_sigint(proc: subprocess.Popen, tag: str, sig: signal.Signals = signal.SIGINT) -> None:
    """SIGINT (Ctrl-C) to the launching process mid-run."""
    _wait_until_running(proc, tag)
    if proc.poll() is None:
        os.kill(proc.pid, sig)


# (fault, what it adds to the 2-rank launch's argv, the exit code it must end with, what it does mid-run, what stderr
# must say); sigterm-parent: a job's deadline, a CI cancel
FAULT_CASES = (
    ("kill-rank", [], 2, fault_kill_rank, "rank 1"),
    ("sigint-parent", [], 130, fault_sigint, "interrupted"),
    ("sigterm-parent", [], 130, functools.partial(fault_sigint, sig=signal.SIGTERM), "interrupted"),
    ("unwritable-results", ["--json", "/dev/null/stress/out.json"], 2, None, "error: cannot write the results file"),
    ("deadline", ["--timeout", "5"], 2, None, "deadline of 5 s exceeded"),
)
FAULTS = len(FAULT_CASES)


def run_all(args, runs: list[Launch], fault_rows: list[Fault]) -> None:
    """Every fault (first: a stress run stopped early still has them), then every launch; appends as it goes."""

    def record(run: Launch, label: str) -> Launch:
        runs.append(run)
        extra = (f"; leaked {len(run.leaked_processes)} process(es), {len(run.leaked_shm)} shm segment(s)"
                 if run.leaked_processes or run.leaked_shm else "")
        print(
            f"{label}: {'hung' if run.exit_code is None else f'exit {run.exit_code}'} (expected {run.expected}), "
            f"{run.wall_s} s{extra}", flush=True)
        return run

    expect = ["--expect", args.expect, "--backend", "gloo"]
    base = [args.python, str(REPRO / TWO_RANK[0]), *expect]
    for name, extra, code, fault, needle in FAULT_CASES:
        run = record(launch(name, [*base, *extra], code, fault=fault), f"fault {name}")
        fault_rows.append(
            Fault(fault=name, handled=run.ok and needle in run.stderr_tail and run.wall_s < DEADLINE_S,
                  expected_exit=code, exit=run.exit_code, wall_s=run.wall_s, message_has=needle,
                  leaked_processes=run.leaked_processes, leaked_shm=run.leaked_shm,
                  stderr_tail=run.stderr_tail[-400:]))
    four = [*base[:2], "--world-size", "4", "--sp", "2", *expect]
    torchrun = [args.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *base[1:]]
    for kind, argv, label in schedule(args.launches, args.four_rank, args.torchrun, args.python, expect, four,
                                      torchrun):
        record(launch(kind, argv, 0), label)


def schedule(launches: int, four_rank: int, torchrun: int, py: str, expect: list[str], four: list[str],
             torchrun_argv: list[str]) -> list[tuple[str, list[str], str]]:
    """Each 2-rank reproducer ``launches`` times, the 4-rank and torchrun launches spread among them (interleaved:
    a run stopped early has launches of every kind)."""
    rounds = max(launches, four_rank, torchrun)
    out = []
    for i in range(rounds):
        for script in TWO_RANK if i < launches else ():
            out.append(("2-rank", [py, str(REPRO / script), *expect], f"{script} 2-rank #{i + 1}"))
        for kind, count, argv in (("4-rank", four_rank, four), ("torchrun", torchrun, torchrun_argv)):
            if i * count // rounds != (done := (i + 1) * count // rounds):
                out.append((kind, argv, f"{TWO_RANK[0]} {kind} #{done}"))
    return out


def summarize(runs: list[Launch], faults: list[Fault], expect: str, faults_expected: int, **rest) -> StressRepro:
    """The counts per kind and in all; ``rest``: environment, interrupted (then never ok) and wall_s."""
    by_kind = {}
    for kind in ("2-rank", "4-rank", "torchrun"):
        rows = [r for r in runs if r.kind == kind]
        by_kind[kind] = KindCounts(
            launches=len(rows), false_reds=sum(r.exit_code not in (None, r.expected) for r in rows),
            hangs=sum(r.exit_code is None for r in rows), leaked_processes=sum(bool(r.leaked_processes) for r in rows),
            leaked_shm=sum(bool(r.leaked_shm) for r in rows), teardown_aborts_absorbed=sum(r.teardown_aborts_absorbed
                                                                                           for r in rows),
            median_wall_s=round(statistics.median([r.wall_s for r in rows]), 2) if rows else None)
    totals = Counts(**{k: sum(getattr(v, k) for v in by_kind.values()) for k in Counts.model_fields})
    ok = (totals.false_reds == totals.hangs == totals.leaked_processes == totals.leaked_shm == 0
          and len(faults) == faults_expected and all(f.handled for f in faults) and not rest["interrupted"])
    return StressRepro(benchmark="stress_repro", expect=expect, by_kind=by_kind, totals=totals, faults=faults,
                       not_ok_launches=[r for r in runs if not r.ok][:10], ok=ok, **rest)


def _terminate(signum, frame):  # SIGTERM: unwind like Ctrl-C, so the launch in flight is cleaned up
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=50, help="launches of each 2-rank reproducer")
    parser.add_argument("--four-rank", type=int, default=20, help="launches of the 4-rank layout (sp=2 x dp=2)")
    parser.add_argument("--torchrun", type=int, default=10, help="launches under torchrun")
    parser.add_argument("--expect", choices=["buggy", "fixed"], default="buggy",
                        help="what the installed DeepSpeed is, passed to every launch (default buggy)")
    parser.add_argument("--python", default=default_python(),
                        help="the interpreter (with torch and DeepSpeed) that runs the reproducers")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default results/benchmarks/stress_repro.json)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    runs: list[Launch] = []
    fault_rows: list[Fault] = []
    interrupted = False
    try:
        run_all(args, runs, fault_rows)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep what ran, marked as such (never "ok")
        interrupted = True
    result = summarize(runs, fault_rows, args.expect, FAULTS, environment=environment(args.python),
                       interrupted=interrupted, wall_s=round(time.monotonic() - started, 1))
    path = write_result(result, args.out)
    t = result.totals
    print(f"{t.launches} launches: {t.false_reds} false reds, {t.hangs} hangs, {t.leaked_processes} "
          f"with leaked processes, {t.leaked_shm} with leaked /dev/shm segments; faults handled "
          f"{sum(f.handled for f in result.faults)}/{len(result.faults)}")
    print(f"{'OK' if result.ok else 'INTERRUPTED' if interrupted else 'FAILED'}: {path}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
