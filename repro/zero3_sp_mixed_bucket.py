#!/usr/bin/env python
"""ZeRO-3 under sequence parallelism: two gradient scales inside one model.

With reduce_scatter=False, contiguous_gradients=True and a small reduce_bucket_size, ZeRO-3
reduces the buckets of small parameters through __avg_scatter_contiguous_grads and every
parameter larger than the bucket through __avg_scatter_grads, in the same backward step.
Unpatched, the first get the right gradient and the second 1/sp of it: layers of one model
are trained with different effective learning rates.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.gradscale import run  # noqa: E402
from repro.gradscale.space import ParamSpec, ZeroConfig  # noqa: E402
from repro.harness.scales import ReducePath  # noqa: E402

# A small "MLP": biases fit a 16-element bucket, weights do not.
LAYERS = tuple(
    ParamSpec(name, numel)
    for name, numel in (("fc1_weight", 64), ("fc1_bias", 8), ("fc2_weight", 96), ("fc2_bias", 12), ("norm_weight", 4)))


def _add_arguments(parser) -> None:
    parser.add_argument("--reduce-bucket-size", type=int, default=16,
                        help="ZeRO-3 reduce_bucket_size (default 16: biases fit, weights do not)")


def _select(args):
    return [ZeroConfig(3, False, True, args.extra["reduce_bucket_size"])]


def main(argv: list[str] | None = None) -> int:
    return run.main(__doc__, "zero3_sp_mixed_bucket", _select, LAYERS, _add_arguments,
                    required_paths=(ReducePath.CONTIGUOUS, ReducePath.AVG_SCATTER), argv=argv)


if __name__ == "__main__":
    sys.exit(main())
