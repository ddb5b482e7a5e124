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

import gc
import math
import os
from collections import Counter
from pathlib import Path

from repro.alst import measure as alst_measure, tiny_llama
from repro.harness import launch
from repro.alst.run import EXPECT_HELP as ALST_EXPECT_HELP, checked_launch
from repro.harness.cli import main_guard
from repro.training.report import EPS, LR, RECIPES, STAGES, STEPS, StepRecord, TrainingReport, TrainingRun

SCRIPT = "training_effect"
DISTINCT_BATCHES = 4  # the steps cycle through these, so the loss falls visibly (the model memorises them)
BATCH_SEED = 8692


def batch(step: int):
    """Step ``step``'s sample, the same on every rank; the sp shards hold different numbers of loss tokens."""
    return alst_measure.tokens(BATCH_SEED * 1000 + step % DISTINCT_BATCHES)


def _adamw(params):
    import torch

    return torch.optim.AdamW(params, lr=LR, eps=EPS, weight_decay=0.0)


def _norm(grads) -> float:
    return math.sqrt(sum(float(g.detach().double().pow(2).sum()) for g in grads))


def reference(model_dir: Path, steps: int) -> list[StepRecord]:
    """The same model, batches and optimizer without sequence parallelism, in plain torch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=alst_measure.ATTN)
    model.train()
    optimizer = _adamw(model.parameters())
    records = []
    for step in range(steps):
        input_ids, position_ids, labels = batch(step)
        optimizer.zero_grad()
        out = model(input_ids=input_ids, position_ids=position_ids, labels=labels)
        out.loss.backward()
        records.append(
            StepRecord(step=step, loss=float(out.loss),
                       grad_norm=_norm([p.grad for p in model.parameters() if p.grad is not None])))
        optimizer.step()
    return records


def sp_run(stage: int, recipe: str, model_dir: Path, mpu, sp: int, gather_impl: str, steps: int) -> TrainingRun:
    """One engine trained ``steps`` steps with ``recipe``'s loss: the per-step records and the reduce paths."""
    from deepspeed.utils import groups

    from repro.harness.engine import destroy_engine, full_gradients, watch_reduce_paths

    engine, _ = alst_measure.sp_engine(stage, model_dir, mpu, sp, _adamw)
    try:
        seen = watch_reduce_paths(engine.optimizer) if stage == 3 else None
        names = [name for name, _ in engine.module.named_parameters()]
        sp_group = groups._get_sequence_parallel_group()
        records = []
        for step in range(steps):
            shard = next(iter(alst_measure.ulysses_adapter(engine, *batch(step))))  # this rank's shard
            to_backprop, full_loss = alst_measure.sp_loss(engine, shard, recipe, sp_group, sp, gather_impl)
            engine.backward(to_backprop)
            norm = _norm(grad for _, _, grad in full_gradients(engine, names, f"zero{stage} {recipe}: "))
            engine.step()
            reported = engine.get_global_grad_norm()
            records.append(
                StepRecord(step=step, loss=full_loss, grad_norm=norm,
                           ds_grad_norm=None if reported is None else float(reported)))
        paths = {"stage_1_and_2": len(names)} if seen is None else dict(Counter(str(p) for p in seen.values()))
        return TrainingRun(stage=stage, recipe=recipe, reduce_paths=paths, steps=records)
    finally:
        destroy_engine(engine)
        del engine
        gc.collect()


def program(ctx: launch.RankContext) -> launch.RankResult:
    # transformers 5.25 loads hub kernels by default (its switch turns them off; the tiny model uses none).
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    if reason := alst_measure.skip_reason():
        raise launch.SkipRank(reason)
    import torch
    import transformers

    from repro.downstream.measure import deepspeed_state

    sp, dp = ctx.topology.sp, ctx.topology.dp
    if dp != 1:
        raise launch.SkipRank(f"the training-effect run is one sp group (dp=1); got sp={sp}, dp={dp}")
    steps = int(ctx.args.extra.get("steps") or STEPS)
    # Rank 0 saves the model first; the reference runs before Ulysses replaces sdpa process-wide.
    if ctx.rank == 0:
        tiny_llama.build(tiny_llama.default_model_dir())
    torch.distributed.barrier()
    model_dir = tiny_llama.build(tiny_llama.default_model_dir())
    # Rank 0 trains the reference; every rank gets it, so each builds the same report.
    shared = [[s.model_dump() for s in reference(model_dir, steps)] if ctx.rank == 0 else None]
    torch.distributed.broadcast_object_list(shared, src=0)
    ref = [StepRecord(**s) for s in shared[0]]
    mpu = alst_measure.register_ulysses(model_dir, sp)
    gather_impl = alst_measure.all_gather_impl(ctx.backend, dp)
    runs = [sp_run(stage, recipe, model_dir, mpu, sp, gather_impl, steps) for stage in STAGES for recipe in RECIPES]
    fixed, marker = deepspeed_state()
    report = TrainingReport(
        **launch.launch_fields(ctx, SCRIPT), deepspeed_fixed=fixed, marker=marker,
        transformers_version=transformers.__version__, reference=ref, runs=runs,
        extra=dict(model=alst_measure.MODEL, optimizer="torch.optim.AdamW", lr=LR, eps=EPS, weight_decay=0.0,
                   gradient_clipping=0.0, dtype="float32", zero_config=alst_measure.ZERO_CONFIG,
                   all_gather=gather_impl))
    return launch.RankResult(report.exit_code, report.to_dict() if ctx.rank == 0 else None)


def _add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps per run (default {STEPS})")


def main(argv: list[str] | None = None) -> int:
    return main_guard(__doc__, checked_launch(program, TrainingReport.emit), _add_arguments, argv=argv,
                      expect_help=ALST_EXPECT_HELP)
