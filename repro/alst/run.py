"""The gradient scale of DeepSpeed's ALST / Ulysses-HF loss recipe, ZeRO-2 and ZeRO-3.

A tiny Llama (``repro/tiny_llama.py``; nothing is downloaded) trains one step under Ulysses sequence parallelism
with DeepSpeed's own ``UlyssesSPAttentionHF`` and ``UlyssesSPDataLoaderAdapter``, one engine per ZeRO stage (default
knobs) and loss recipe, and its full gradients are compared with a plain-torch baseline of the same samples without
sequence parallelism. ``allgather`` is the recipe of DeepSpeed's tutorial and ``TestUlyssesSPHF`` (the
differentiable all_gather of the shard losses: its backward sums over the sp ranks); with ``own_share`` every rank
backprops only ``loss_r * tokens_r / total_tokens``. The scales --expect names are the rule of
``repro/harness/scales.py``; the tolerances are in ``repro/alst/expect.py`` (docs/alst-recipe.md).

Needs transformers (the ``alst`` extra) and a DeepSpeed with ``UlyssesSPAttentionHF`` (0.17.2 and later); without
either it exits 77 with the reason. sp must divide the model's 4 attention heads (sp = 2 or 4).
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from repro.alst import tiny_llama
from repro.alst.measure import SEQ_LEN, program, skip_reason
from repro.alst.report import AlstReport
from repro.harness import exit_codes, launch
from repro.harness.cli import ReproArgs, main_guard

EXPECT_HELP = (
    "which scales must be seen: buggy (unpatched): allgather ZeRO-2 at sp and ZeRO-3 at 1, own_share ZeRO-2 "
    "at 1 and ZeRO-3 at 1/sp; fixed: ZeRO-3 as ZeRO-2, allgather at sp and own_share at 1 (default fixed)")


def usage_error(args: ReproArgs) -> str | None:
    heads = tiny_llama.TINY_LLAMA_CONFIG["num_attention_heads"]
    if args.sp < 2:
        return f"--sp must be >= 2 for a sequence-parallel check, got {args.sp}"
    if heads % args.sp or SEQ_LEN % args.sp:
        return f"--sp {args.sp} must divide the model's {heads} attention heads and the {SEQ_LEN}-token sample"
    return None


def preflight(args: ReproArgs) -> int | None:
    """The exit code when the check cannot run here (bad arguments, or a skip), before any rank starts."""
    if problem := usage_error(args):
        print(f"error: {problem}", file=sys.stderr)
        return exit_codes.ERROR
    if not launch.external_launcher_env() and launch.CHILD_DIR_VAR not in os.environ and (reason := skip_reason()):
        print(f"SKIP: {reason}", flush=True)
        return exit_codes.SKIPPED
    return None


def checked_launch(program, emit) -> Callable[[ReproArgs], int]:
    """The run of an ALST-recipe family (this one, training and downstream): the preflight, then the ranks."""

    def run(args: ReproArgs) -> int:
        stop = preflight(args)
        return stop if stop is not None else launch.run(args, program, lambda rep, wall: emit(rep, wall, args.json))

    return run


def main(argv: list[str] | None = None) -> int:
    return main_guard(__doc__, checked_launch(program, AlstReport.emit), argv=argv, expect_help=EXPECT_HELP)
