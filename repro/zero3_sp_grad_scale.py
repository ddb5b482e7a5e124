#!/usr/bin/env python
"""ZeRO-3 under sequence parallelism: one model, every reduction path, one oracle.

In one launch (one process group, one engine per configuration, each destroyed before the
next) a model with a 4-element and a 64-element parameter runs ZeRO-1 and ZeRO-2 as
references and the four ZeRO-3 configurations (reduce_scatter, contiguous_gradients,
reduce_bucket_size) = (False, True, 500), (False, False, 500), (True, True, 500),
(False, True, 16). Each rank feeds its own inputs; DeepSpeed's full gradient of each
parameter is compared with the oracle (sum over the sp ranks, mean over the dp ranks of the
ranks' local gradients, computed in plain torch). Unpatched DeepSpeed (0.11.2 .. 0.19.8)
returns 1/sp of it for every gradient that goes through ZeRO-3's __avg_scatter_grads.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.gradscale import run  # noqa: E402
from repro.gradscale.space import REFERENCE_CONFIGS, SMALL_AND_LARGE, ZERO3_CONFIGS  # noqa: E402

ALL_CONFIGS = REFERENCE_CONFIGS + ZERO3_CONFIGS


def _add_arguments(parser) -> None:
    parser.add_argument(
        "--config", dest="configs", action="append", choices=[c.label() for c in ALL_CONFIGS], metavar="LABEL",
        help="run only this configuration (repeatable); labels: " + ", ".join(repr(c.label()) for c in ALL_CONFIGS))


def _select(args):
    wanted = args.extra.get("configs")
    return [c for c in ALL_CONFIGS if not wanted or c.label() in wanted]


def main(argv: list[str] | None = None) -> int:
    return run.main(__doc__, "zero3_sp_grad_scale", _select, SMALL_AND_LARGE, _add_arguments, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
