"""The ALST recipe check's rank side (``program``, which ``repro.alst.run`` launches): the tiny Llama, the baseline,
one engine per stage and recipe (docs/code/repro-alst-training-downstream.md)."""

from __future__ import annotations

import functools
import gc
import importlib.util
import inspect
import os
from pathlib import Path

from repro.alst import tiny_llama
from repro.alst.report import AlstReport, loss_entry, make_row, other_group_mismatch
from repro.alst.expect import RECIPES, STAGES, TORCH_ALL_GATHER
from repro.harness import launch
from repro.harness.env import dist_version

SCRIPT = "alst_recipe"
# DeepSpeed's test looks at layer 0's q_proj; the others cover an MLP weight, a norm and the (untied) output head.
PARAMS = ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight",
          "lm_head.weight")
SEQ_LEN = 16  # divisible by sp = 2 and 4
MASKED_PREFIX = 3  # labels[:3] = -100 ("prompt"); every shard still has >= 1 loss token at sp = 4
_SAMPLE_SEED = 8692
ATTN = "sdpa"
MODEL = tiny_llama.HUB_REPO_ID + " shape, local seeded weights"
ZERO_CONFIG = "stage only (DeepSpeed defaults: ZeRO-3 reduce_scatter=True)"


def skip_reason() -> str | None:
    """Why this check cannot run with the installed packages, or None. Imports neither package."""
    if importlib.util.find_spec("transformers") is None:
        return ("transformers is not installed: the ALST recipe check needs it "
                "(pip install 'zero3-sp-gradfix[alst]')")
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.origin:
        return "deepspeed is not installed"
    ulysses = Path(spec.origin).parent / "runtime" / "sequence_parallel" / "ulysses_sp.py"
    if not ulysses.exists() or "class UlyssesSPAttentionHF" not in ulysses.read_text(errors="replace"):
        return (f"DeepSpeed {dist_version('deepspeed') or 'none'} has no UlyssesSPAttentionHF "
                "(added in 0.17.2): the ALST recipe does not exist there")
    return None


def tokens(seed):
    """A seeded sample: (input_ids, position_ids, labels), each [1, SEQ_LEN], the first MASKED_PREFIX labels -100.
    ``seed``: an int, or a torch.Generator to draw from in turn (successive samples of one stream)."""
    import torch

    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, tiny_llama.TINY_LLAMA_CONFIG["vocab_size"], (1, SEQ_LEN), generator=gen)
    labels = input_ids.clone()
    labels[:, :MASKED_PREFIX] = -100
    return input_ids, torch.arange(SEQ_LEN).unsqueeze(0), labels


def sample(dp_index: int):
    return tokens(_SAMPLE_SEED * 100 + dp_index)


def baseline(model_dir: Path, dp: int, device: str):
    """Per dp group: the full-sequence loss and gradients (float64 copies), in plain torch."""
    from transformers import AutoModelForCausalLM

    losses, grads = [], []
    for g in range(dp):
        model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=ATTN).to(device)
        model.train()
        input_ids, position_ids, labels = (t.to(device) for t in sample(g))
        out = model(input_ids=input_ids, position_ids=position_ids, labels=labels)
        out.loss.backward()
        named = dict(model.named_parameters())
        grads.append({p: named[p].grad.detach().double().cpu().clone() for p in PARAMS})
        losses.append(float(out.loss))
        del model, out
    expected = {p: sum(gr[p] for gr in grads) / dp for p in PARAMS}
    return losses, expected


def register_ulysses(model_dir: Path, sp: int):
    """``UlyssesSPAttentionHF.register_with_transformers``; its keyword for the length changed in 0.18."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    kwargs = dict(model_name_or_path=str(model_dir), core_attn_implementation=ATTN, sequence_parallel_size=sp,
                  micro_batch_size=1, seq_length_is_variable=True)
    params = inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters
    kwargs["seq_length" if "seq_length" in params else "max_length"] = SEQ_LEN
    return UlyssesSPAttentionHF.register_with_transformers(**kwargs)


EQUIVALENT_ALL_GATHER = "repro.alst.measure: all_gather, backward = sum over the group (as torch's)"


def all_gather_impl(backend: str, dp: int) -> str:
    """Which differentiable all_gather the allgather recipe uses: torch's, except on gloo with dp > 1, where its
    backward fails on every sp group without global rank 0 (torch 2.13) and an equivalent stands in."""
    return EQUIVALENT_ALL_GATHER if backend == "gloo" and dp > 1 else TORCH_ALL_GATHER


@functools.cache
def _gather_fn():
    import torch
    import torch.distributed as tdist

    class AllGatherSumBackward(torch.autograd.Function):

        @staticmethod
        def forward(ctx, group, tensor):
            ctx.group = group
            out = [torch.empty_like(tensor) for _ in range(tdist.get_world_size(group=group))]
            tdist.all_gather(out, tensor.contiguous(), group=group)
            return tuple(out)

        @staticmethod
        def backward(ctx, *grads):
            stacked = torch.stack([g.contiguous() for g in grads])
            tdist.all_reduce(stacked, group=ctx.group)
            return None, stacked[tdist.get_rank(group=ctx.group)]

    return AllGatherSumBackward


def _equivalent_all_gather(tensor, group):
    return _gather_fn().apply(group, tensor)


def sp_backward_loss(recipe: str, loss_local, shift_labels, sp_group, sp_world_size: int, gather_impl: str):
    """(the tensor to backprop, the full-sequence loss value) for one recipe on this sp rank."""
    import torch
    import torch.distributed as tdist
    import torch.distributed.nn.functional  # noqa: F401 - `import torch` does not import it

    good = (shift_labels != -100).view(-1).sum()
    if recipe == "allgather":
        # DeepSpeed's tutorial / TestUlyssesSPHF, as written there.
        all_gather = (torch.distributed.nn.functional.all_gather
                      if gather_impl == TORCH_ALL_GATHER else _equivalent_all_gather)
        losses_per_rank = all_gather(loss_local, group=sp_group)
        good_per_rank = all_gather(good, group=sp_group)
        total_loss = sum(losses_per_rank[r] * good_per_rank[r] for r in range(sp_world_size))
        loss = total_loss / sum(good_per_rank)
        return loss, float(loss)
    if recipe == "own_share":
        total_good = good.clone()
        tdist.all_reduce(total_good, group=sp_group)  # not differentiable: a count
        share = loss_local * good / total_good
        full = share.detach().clone()
        tdist.all_reduce(full, group=sp_group)
        return share, float(full)
    raise ValueError(f"unknown recipe {recipe!r}")


def sp_engine(stage: int, model_dir: Path, mpu, sp: int, make_optimizer=None):
    """The tiny Llama under ZeRO-``stage`` with ``sp`` sequence-parallel ranks: (engine, config); default SGD, lr 0."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from repro.harness.engine import ds_config

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=ATTN)
    optimizer = (make_optimizer or functools.partial(torch.optim.SGD, lr=0.0))(model.parameters())
    config = ds_config({"stage": stage}, sequence_parallel_size=sp)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, mpu=mpu, config=config)
    return engine, config


def ulysses_adapter(engine, input_ids, position_ids, labels):
    """DeepSpeed's UlyssesSPDataLoaderAdapter over one sample (both families' loaders). Every rank of an sp group
    holds the same sample, so the adapter's first micro-batch is it, sharded."""
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from deepspeed.utils import groups

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(input_ids, position_ids, labels), batch_size=1, collate_fn=lambda b: dict(
            input_ids=b[0][0].unsqueeze(0), position_ids=b[0][1].unsqueeze(0), labels=b[0][2].unsqueeze(0)))
    return UlyssesSPDataLoaderAdapter(loader, sp_rank=groups._get_sequence_parallel_rank(),
                                      sp_group=groups._get_sequence_parallel_group(),
                                      sp_world_size=groups._get_sequence_parallel_world_size(), device=engine.device)


def sp_shard(engine, dp_index: int, notes: dict[str, str]):
    """This rank's shard of sample ``dp_index`` through UlyssesSPDataLoaderAdapter: (batch, sp group, sp size).
    ``notes`` (its report's extra) gets "adapter" when the adapter cannot run here."""
    from deepspeed.utils import groups

    sp_world_size = groups._get_sequence_parallel_world_size()
    input_ids, position_ids, labels = sample(dp_index)
    batch = _first_shard(ulysses_adapter(engine, input_ids, position_ids, labels), input_ids, position_ids, labels,
                         groups._get_sequence_parallel_rank(), sp_world_size, notes)
    return batch, groups._get_sequence_parallel_group(), sp_world_size


def sp_loss(engine, shard: dict, recipe: str, sp_group, sp: int, gather_impl: str):
    """The engine's forward on this rank's shard and ``recipe``'s loss: (what to backprop, the full-sequence loss)."""
    shift_labels = shard["shift_labels"].to(engine.device)
    outputs = engine(input_ids=shard["input_ids"].to(engine.device),
                     position_ids=shard["position_ids"].to(engine.device))
    loss_local = engine.module.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                             vocab_size=engine.module.config.vocab_size)
    return sp_backward_loss(recipe, loss_local, shift_labels, sp_group, sp, gather_impl)


def run_sp(stage: int, recipe: str, model_dir: Path, mpu, sp: int, dp_index: int, gather_impl: str, notes: dict):
    """One engine, one step: {param: full gradient}, the full-sequence loss, {param: reduce path}."""
    from repro.harness.engine import destroy_engine, full_gradients, watch_reduce_paths

    engine, _config = sp_engine(stage, model_dir, mpu, sp)
    try:
        paths = watch_reduce_paths(engine.optimizer) if stage == 3 else None
        batch, sp_group, sp_world_size = sp_shard(engine, dp_index, notes)
        to_backprop, full_loss = sp_loss(engine, batch, recipe, sp_group, sp_world_size, gather_impl)
        engine.backward(to_backprop)
        grads, reduce_paths = {}, {}
        for name, param, grad in full_gradients(engine, list(PARAMS), f"zero{stage} {recipe}: "):
            grads[name] = grad.detach().double().cpu().clone()
            reduce_paths[name] = "stage_1_and_2" if stage in (1, 2) else str(paths.get(id(param), "unobserved"))
        return grads, full_loss, reduce_paths
    finally:
        destroy_engine(engine)
        del engine
        gc.collect()


def _first_shard(adapter, input_ids, position_ids, labels, sp_rank: int, sp_world_size: int, notes: dict) -> dict:
    """The adapter's first micro-batch; where gloo rejects the adapter's 0-dim seqlen all_gather (DeepSpeed 0.17.x
    .. 0.19.6-dev; every rank raises before data moves), the same by hand: labels padded, shifted, sliced."""
    import torch

    try:
        return next(iter(adapter))
    except RuntimeError as err:
        if "invalid tensor size" not in str(err):
            raise
    notes["adapter"] = ("manual sharding: this DeepSpeed's UlyssesSPDataLoaderAdapter all_gathers a 0-dim "
                        "seqlen, which gloo rejects (fixed in 0.19.8)")
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    chunk = input_ids.shape[1] // sp_world_size
    cut = slice(chunk * sp_rank, chunk * (sp_rank + 1))
    return {"input_ids": input_ids[:, cut], "position_ids": position_ids[:, cut], "shift_labels": shift[:, cut]}


def program(ctx: launch.RankContext) -> launch.RankResult:
    # transformers 5.25 loads hub kernels by default (needs a `kernels` PyPI lacks); the tiny model uses none.
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    if reason := skip_reason():
        raise launch.SkipRank(reason)
    import torch

    try:
        import deepspeed.runtime.sequence_parallel.ulysses_sp  # noqa: F401
        import transformers
    except ImportError as err:
        raise launch.SkipRank(f"cannot import the ALST pieces: {err}") from err

    sp, dp = ctx.topology.sp, ctx.topology.dp
    dp_index = ctx.rank // sp
    model_dir = tiny_llama.build(tiny_llama.default_model_dir())
    # The baseline first: registering Ulysses replaces the sdpa attention function process-wide.
    baseline_losses, expected = baseline(model_dir, dp, ctx.device)
    mpu = register_ulysses(model_dir, sp)
    gather_impl = all_gather_impl(ctx.backend, dp)
    rows, losses, notes = [], [], {}
    for stage in STAGES:
        for recipe in RECIPES:
            grads, full_loss, paths = run_sp(stage, recipe, model_dir, mpu, sp, dp_index, gather_impl, notes)
            rows.extend(
                make_row(recipe, stage, name, grads[name], expected[name], sp, ctx.args.expect, paths[name])
                for name in PARAMS)
            losses.append(loss_entry(recipe, stage, full_loss, baseline_losses[dp_index]))
    # Rank 0 reports dp group 0's losses; every rank checked its own, and a mismatch anywhere fails.
    mine_ok = all(x["ok"] for x in losses)
    flag = torch.tensor([0 if mine_ok else 1])
    torch.distributed.all_reduce(flag)
    if int(flag) and mine_ok:
        losses.append(other_group_mismatch())
    report = AlstReport(
        **launch.launch_fields(ctx, SCRIPT), transformers_version=transformers.__version__, rows=rows, losses=losses,
        extra=dict(model=MODEL, model_dir=str(model_dir), attn_implementation=ATTN, all_gather=gather_impl,
                   seq_len=SEQ_LEN, masked_prefix=MASKED_PREFIX, zero_config=ZERO_CONFIG, dtype="float32", **notes))
    return launch.RankResult(report.exit_code, report.to_dict() if ctx.rank == 0 else None)
