"""The gradient scale that the own sp loss code of transformers, accelerate, ArcticTraining, trl and axolotl gets.

For every client installed in this interpreter, and ZeRO-2 and ZeRO-3 (DeepSpeed's defaults), one real engine
trains the tiny Llama one step under Ulysses sequence parallelism with the loss the client's own function returns.
Measured: the ratio of DeepSpeed's full gradient to the non-sp baseline gradient of the same sample. Expected: the
rule of ``repro/downstream/expect.py`` (the client's recipe kind and gate, read from its source, times DeepSpeed's
ZeRO-3 reduction with or without the fix, as --expect says the installed DeepSpeed is).

The run holds (exit 0) iff every measured row's ratio matches the rule; a row whose rule value is not 1 is a known
mis-scaling: it holds, and its verdict names the factor. A client release without an sp loss function gives a "not
applicable" row, a client that fails to import an error row (exit 2); a run with nothing to measure exits 77.

Needs transformers and a DeepSpeed with ``UlyssesSPAttentionHF`` (0.17.2 and later).

More: docs/code/repro-alst-training-downstream.md
"""

from __future__ import annotations

from repro.alst.run import checked_launch
from repro.downstream.measure import program
from repro.downstream.report import DownstreamReport
from repro.harness.cli import main_guard

EXPECT_HELP = (
    "what the installed DeepSpeed is: buggy (unpatched) or fixed (carries the fix); every client's gradient "
    "must be at the scale the rule gives it then, a known mis-scaling included (default fixed)")


def main(argv: list[str] | None = None) -> int:
    written: dict = {}

    def emit(report: dict, wall: float, json_path) -> None:
        written.update(report)
        DownstreamReport.emit(report, wall, json_path)

    code = main_guard(__doc__, checked_launch(program, emit), argv=argv, expect_help=EXPECT_HELP)
    # The report decides 2 (an error row) and 77 (nothing to measure); the ranks return 0/1.
    return written.get("exit_code", code) if code in (0, 1) else code
