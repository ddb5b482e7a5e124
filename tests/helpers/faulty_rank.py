#!/usr/bin/env python
"""A rank program that misbehaves on purpose, run by the real launcher (tests only).

--fault raise: rank 1 raises after the process group is up; rank 0 blocks in a barrier.
--fault hang:  every rank sleeps past the deadline.
--fault skip:  rank 0 says it cannot run here.
--fault abort: every rank reports success, then dies by SIGABRT (DeepSpeed's abort at exit).
Each rank writes its pid to $FAULTY_PID_DIR so the test can prove none outlives the launch.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from repro.harness import launch  # noqa: E402
from repro.harness.cli import main_guard  # noqa: E402


def _add(parser):
    parser.add_argument("--fault", choices=["raise", "hang", "skip", "abort"], required=True)


def _write_pid(rank: int | str) -> None:
    Path(os.environ["FAULTY_PID_DIR"], f"rank{rank}.pid").write_text(str(os.getpid()))


def main() -> int:
    if launch.CHILD_DIR_VAR in os.environ:
        # A rank of a local launch: known from its start, whatever the deadline finds it doing (on a
        # loaded machine still importing torch before the program runs).
        _write_pid(os.environ["RANK"])

    def run(args):

        def program(ctx: launch.RankContext) -> launch.RankResult:
            _write_pid(ctx.rank)
            fault = ctx.args.extra["fault"]
            if fault == "raise":
                if ctx.rank == 1:
                    raise ValueError("injected failure on rank 1")
                import torch.distributed as tdist

                tdist.barrier()  # never completes: rank 1 is gone
            if fault == "hang":
                time.sleep(3600)
            if fault == "skip" and ctx.rank == 0:
                raise launch.SkipRank("injected skip")
            if fault == "skip":
                time.sleep(3600)
            if fault == "abort":
                # Report, then die the way DeepSpeed's CPU backend sometimes does at exit.
                real_exit = os._exit
                os._exit = lambda code: os.kill(os.getpid(), signal.SIGABRT)  # noqa: E731
                del real_exit
            return launch.RankResult(0, {"ok": True} if ctx.rank == 0 else None)

        return launch.run(args, program, lambda report, wall: print(f"REPORT {report}"))

    return main_guard(__doc__, run, _add)


if __name__ == "__main__":
    sys.exit(main())
