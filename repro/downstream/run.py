#!/usr/bin/env python
"""The gradient scale that HF transformers', accelerate's and ArcticTraining's own sp loss code gets from DeepSpeed.

For every client installed in this interpreter, and ZeRO-2 and ZeRO-3 (DeepSpeed's defaults),
one real engine trains the tiny Llama one step under Ulysses sequence parallelism with the loss
the client's own function returns (imported from the installed client; ``repro/downstream_run.py``
says how each is called). Measured: the ratio of DeepSpeed's full gradient to the non-sp
baseline gradient of the same sample, and the residual of that fit. Expected: the one rule of
``repro/downstream_rule.py`` (the client's recipe kind and gate, read from its source, times
DeepSpeed's ZeRO-3 reduction with or without the fix).

--expect says what the installed DeepSpeed is: ``buggy`` (unpatched) or ``fixed`` (carries the
fix; whether it exposes the ``ZERO3_SP_GRADIENTS_SUMMED`` marker is read from it). The run holds
(exit 0) iff every measured row's ratio matches the rule evaluated under that assumption, so
each run checks the rule and, through it, whether DeepSpeed is what --expect says. A row whose
rule value is not 1.0 is a known mis-scaling: it holds, and its verdict names the factor. A
client release without an sp loss function gives a "not applicable" row, a client that fails
to import an error row (exit 2); a run with nothing to measure exits 77.

Needs transformers and a DeepSpeed with ``UlyssesSPAttentionHF`` (0.17.2 and later).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repro package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro import alst_recipe, downstream_run, tiny_llama  # noqa: E402
from repro.harness import launch  # noqa: E402
from repro.harness.cli import EXIT_SKIP, ReproArgs, main_guard  # noqa: E402
from repro.downstream_rule import DownstreamReport, render_table  # noqa: E402

SCRIPT = "downstream_clients"


def program(ctx: launch.RankContext) -> launch.RankResult:
    reason = alst_recipe.skip_reason()
    if reason:
        raise launch.SkipRank(reason)
    # transformers 5.25 loads hub kernels by default and needs `kernels>=0.19.1,<0.20`, which PyPI
    # does not have; the tiny fp32 CPU model uses none. Its documented switch turns them off.
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    import torch

    clients = downstream_run.find_clients()
    sp, dp = ctx.topology.sp, ctx.topology.dp
    dp_index = ctx.rank // sp
    # Rank 0 saves the model first: two ranks saving a new transformers version's copy at once were seen to
    # make the other rank read a config.json without model_type (transformers 5.24, first run).
    if ctx.rank == 0:
        tiny_llama.build(tiny_llama.default_model_dir())
    torch.distributed.barrier()
    model_dir = tiny_llama.build(tiny_llama.default_model_dir())
    # The baseline first: registering Ulysses replaces the sdpa attention function process-wide.
    _, expected = alst_recipe.baseline(model_dir, dp, ctx.device)
    mpu = alst_recipe.register_ulysses(model_dir, sp)
    fixed, marker = downstream_run.deepspeed_state()
    ds_version = downstream_run.dist_version("deepspeed") or "none"
    notes: dict[str, str] = {}
    rows = downstream_run.measure_all(clients, model_dir, mpu, sp, dp_index, expected, ctx.args.expect == "fixed",
                                      ds_version, marker, notes)
    report = DownstreamReport(
        script=SCRIPT, deepspeed_version=ds_version, deepspeed_fixed=fixed, marker=marker,
        torch_version=torch.__version__, backend=ctx.backend, device=ctx.device.split(":")[0],
        launcher="external" if ctx.external_launcher else "local", world_size=ctx.world_size, sp=sp, dp=dp,
        expect=ctx.args.expect, rows=rows, python_version=platform.python_version(),
        extra={"model": tiny_llama.HUB_REPO_ID + " shape, local seeded weights", "seq_len": alst_recipe.SEQ_LEN,
               "masked_prefix": alst_recipe.MASKED_PREFIX, "params": list(downstream_run.PARAMS),
               "zero_config": "stage only (DeepSpeed defaults: ZeRO-3 reduce_scatter=True)", "dtype": "float32",
               "callers": "transformers: accelerator and ParallelismConfig stand-ins (sp group, sp_backend, "
                          "sp_size) + a real HfDeepSpeedConfig; arctic_training: a stand-in SFTTrainer (engine, "
                          "module, device, sp group, config)",
               **notes})
    code = report.exit_code
    return launch.RankResult(1 if code == 1 else 0, report.to_dict() if ctx.rank == 0 else None)


def emit(report_dict: dict, wall_time_s: float, json_path: Path | None) -> None:
    report = DownstreamReport.from_dict(report_dict)
    report.wall_time_s = round(wall_time_s, 3)
    print(render_table(report), flush=True)
    if json_path is not None:
        report.write(json_path)


def main(argv: list[str] | None = None) -> int:

    def run(args: ReproArgs) -> int:
        problem = alst_recipe.usage_error(args)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        if not launch.external_launcher_env() and launch.CHILD_DIR_VAR not in os.environ:
            reason = alst_recipe.skip_reason()  # cheap, before any rank starts
            if reason:
                print(f"SKIP: {reason}", flush=True)
                return EXIT_SKIP
        written: dict = {}

        def sink(report: dict, wall: float) -> None:
            written.update(report)
            emit(report, wall, args.json)

        code = launch.run(args, program, sink)
        # The report decides 2 (an error row) and 77 (nothing to measure); the ranks return 0/1.
        return written.get("exit_code", code) if code in (0, 1) else code

    return main_guard(__doc__, run, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
