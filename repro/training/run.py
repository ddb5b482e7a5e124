"""The training-level effect of the ZeRO-3 sp gradient scale: loss and gradient norm over a short run.

The tiny Llama trains ``--steps`` steps with AdamW on the same batches under ZeRO-2 and ZeRO-3 (DeepSpeed's default
knobs), with the ALST all_gather recipe and the own-share recipe, one engine each, in one launch; and once in plain
torch without sequence parallelism (the true gradient). --expect holds iff every run's gradient norm sits at the
rule's factor of the reference on every step and every loss on the reference's. ``python -m repro.training.figure``
draws two such reports (unpatched and patched) into one figure.

Needs transformers and DeepSpeed >= 0.19.8 on gloo (its UlyssesSPDataLoaderAdapter shards each step;
older ones all_gather a 0-dim length gloo rejects); one sp group (world size = sp = 2 or 4).

More: docs/code/repro-alst-training-downstream.md
"""

from __future__ import annotations

from repro.alst.run import EXPECT_HELP as ALST_EXPECT_HELP, checked_launch
from repro.harness.cli import main_guard
from repro.training.measure import program
from repro.training.report import emit
from repro.training.space import STEPS


def _add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps per run (default {STEPS})")


def main(argv: list[str] | None = None) -> int:
    return main_guard(__doc__, checked_launch(program, emit), _add_arguments, argv=argv, expect_help=ALST_EXPECT_HELP)
