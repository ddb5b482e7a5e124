"""Drive the installed clients' own sp loss functions on real DeepSpeed engines (rank side).

The loss backpropagated is whatever the client's own function returns, imported from the installed client, never
copied; the callers' objects it reads are stood in for (docs/code/repro-alst-training-downstream.md says how, per
client). ``program`` is the rank program ``repro.downstream.run`` launches.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import gc
import importlib
import importlib.util
import inspect
import os
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Callable

from repro.alst import measure as alst_measure, tiny_llama
from repro.alst.expect import fit
from repro.downstream.expect import (CLIENTS, MARKER_MODULE, MARKER_NAME, STAGES, VIA_CLIENTS, ClientKind, classify,
                                     compensates, expected_ratio)
from repro.downstream.report import ClientRow, DownstreamReport
from repro.harness import launch, scales
from repro.harness.env import dist_version
from repro.harness.report import error_line

SCRIPT = "downstream_clients"
ACCELERATE_SCRIPT = "accelerate.test_utils.scripts.external_deps.test_ds_alst_ulysses_sp"
CALLERS = (
    "transformers: accelerator and ParallelismConfig stand-ins (sp group, sp_backend, sp_size) + a real "
    "HfDeepSpeedConfig; arctic_training: a stand-in SFTTrainer (engine, module, device, sp group, config); trl, "
    "axolotl: their Trainer subclass made with object.__new__ holding the same accelerator stand-in, the engine "
    "and the attributes their compute_loss reads")


def deepspeed_state() -> tuple[bool, bool]:
    """(the installed stage3.py carries the fix, the capability marker is True), read from DeepSpeed."""
    from repro.harness.fixed import source_has_fix

    module = importlib.import_module(MARKER_MODULE)
    fixed = source_has_fix(Path(module.__file__).read_text())
    return fixed, bool(getattr(module, MARKER_NAME, False))


def client_source(fn) -> str:
    """The function's source and that of the same-module functions it calls by name (one level): a client may
    move its gate into a helper (the proposed transformers patch does), and classify() must see it."""
    fn = getattr(fn, "__func__", fn)
    parts = [inspect.getsource(fn)]
    for name in fn.__code__.co_names:
        callee = fn.__globals__.get(name)
        if inspect.isfunction(callee) and callee.__module__ == fn.__module__ and callee is not fn:
            parts.append(inspect.getsource(callee))
    return "\n".join(parts)


@dataclasses.dataclass(frozen=True)
class Client:
    """A loss function found in an installed client, or why there is none to call."""

    name: str
    version: str
    function: str  # dotted name of what is called
    call: Callable | None = None  # (engine, batch, sp_group, sp, ds_config) -> the tensor to backprop
    kind: ClientKind | None = None
    why_not: str = ""  # not applicable
    error: str = ""  # installed, but importing it failed
    exclude: dict = dataclasses.field(default_factory=dict)  # params left out of the fit (not the recipe's scale): why
    reaches: tuple[str, types.CodeType] | None = None  # trl, axolotl: (name, code) of the loss fn they must call


def transformers_sp_loss():
    """(function, dotted name, the Trainer class when it is Trainer's method (5.0-5.1)) of transformers' sp loss;
    (None, "-", None) when the installed transformers has none; raises when transformers does not import."""
    integ = importlib.import_module("transformers.integrations.deepspeed")
    if (fn := getattr(integ, "deepspeed_sp_compute_loss", None)) is not None:
        return fn, "transformers.integrations.deepspeed.deepspeed_sp_compute_loss", None
    trainer_cls = importlib.import_module("transformers.trainer").Trainer
    if (fn := getattr(trainer_cls, "_deepspeed_sp_compute_loss", None)) is not None:
        return fn, "transformers.trainer.Trainer._deepspeed_sp_compute_loss", trainer_cls
    return None, "-", None


def no_transformers_sp_loss(version: str) -> str:
    return (f"transformers {version} has no sequence-parallel loss function "
            "(neither integrations.deepspeed.deepspeed_sp_compute_loss nor "
            "Trainer._deepspeed_sp_compute_loss; added in 5.0)")


@contextlib.contextmanager
def hf_deepspeed_config(ds_config: dict):
    """What accelerate sets up for a DeepSpeed run: transformers' is_deepspeed_zero3_enabled() reads it."""
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    hf_config = HfDeepSpeedConfig(dict(ds_config))
    try:
        yield hf_config
    finally:
        del hf_config
        unset_hf_deepspeed_config()


def sp_accelerator(sp_group, sp: int):
    """A stand-in for accelerate's Accelerator under DeepSpeed sp: what the clients' loss code reads of it
    (``gather_for_metrics``, for trl's logged metrics only, returns this rank's value)."""
    pc = types.SimpleNamespace(sp_backend="deepspeed", sp_size=sp, sp_enabled=sp > 1, tp_size=1)
    return types.SimpleNamespace(parallelism_config=pc,
                                 torch_device_mesh={"sp": types.SimpleNamespace(get_group=lambda: sp_group)},
                                 gather_for_metrics=lambda tensor: tensor)


def trainer_instance(cls, **attributes):
    """A real instance of a client's Trainer subclass (``super()`` resolves), without its __init__ (a whole run)."""
    trainer = object.__new__(cls)
    vars(trainer).update(attributes)
    return trainer


def codes_called(thunk: Callable, codes: dict[str, types.CodeType]):
    """(thunk's result, the names in ``codes`` whose code object was entered while it ran), this thread."""
    wanted = set(codes.values())
    seen: set = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in wanted:
            seen.add(frame.f_code)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = thunk()
    finally:
        sys.setprofile(previous)
    return result, sorted(name for name, code in codes.items() if code in seen)


def find_transformers(version: str) -> Client:
    try:
        fn, fn_name, trainer_cls = transformers_sp_loss()
    except Exception as err:  # noqa: BLE001 - any import failure is the row's content
        return Client("transformers", version, "transformers.integrations.deepspeed.deepspeed_sp_compute_loss",
                      error=error_line(err))
    if fn is None:
        return Client("transformers", version, "-", why_not=no_transformers_sp_loss(version))

    def call(engine, batch, sp_group, sp, ds_config):
        accelerator = sp_accelerator(sp_group, sp)
        caller = accelerator if trainer_cls is None else types.SimpleNamespace(accelerator=accelerator)
        with hf_deepspeed_config(ds_config):
            return fn(caller, engine, dict(batch), False, accelerator.parallelism_config)

    return Client("transformers", version, fn_name, call, classify(client_source(fn)))


def trainer_client(client: str, version: str, trainer: str, who: str, make_trainer: Callable,
                   why_not_called: Callable = lambda module, version: "") -> Client:
    """A client whose Trainer subclass (``trainer``, in its ``VIA_CLIENTS`` code file) hands the sp loss to
    transformers' in its compute_loss, called on ``make_trainer(module, engine, accelerator)``; its row without a
    call when it cannot be called (an import error, no sp loss in transformers, ``why_not_called``'s reason)."""
    code_file = next(c.code_file for c in VIA_CLIENTS if c.name == client)
    module = code_file.removesuffix(".py").replace("/", ".")
    entry_name = f"{module}.{trainer}.compute_loss"
    try:
        imported = importlib.import_module(module)
        entry = getattr(imported, trainer).compute_loss
        loss_fn, loss_name, _ = transformers_sp_loss()
    except Exception as err:  # noqa: BLE001 - any import failure is the row's content
        return Client(client, version, entry_name, error=error_line(err))
    if loss_fn is None:
        return Client(
            client, version, entry_name,
            why_not=f"{who} hands the sp loss to transformers' Trainer.compute_loss, and " +
            no_transformers_sp_loss(dist_version("transformers")))
    if why_not := why_not_called(imported, version):
        return Client(client, version, entry_name, why_not=why_not)

    def call(engine, batch, sp_group, sp, ds_config):
        trainer = make_trainer(imported, engine, sp_accelerator(sp_group, sp))
        with hf_deepspeed_config(ds_config):
            return entry(trainer, engine, dict(batch), False)

    return Client(client, version, entry_name, call, classify(client_source(loss_fn), client_source(entry)),
                  reaches=(loss_name, loss_fn.__code__))


def find_trl(version: str) -> Client:

    def why_not_called(sft, version: str) -> str:
        return "" if hasattr(sft, "add_fused_lm_head") else (
            f"not called: this reproducer drives SFTTrainer.compute_loss as trl 1.16 writes it "
            f"(the model's forward given trl's fused LM head, add_fused_lm_head); trl {version}'s "
            "sft_trainer has no add_fused_lm_head")

    def make_trainer(sft, engine, accelerator):
        # SFTTrainer.__init__ gives the model trl's fused LM head; compute_loss asks for it (fused_lm_head=True).
        sft.add_fused_lm_head(engine.module, outputs=("log_probs", "entropy", "is_top1"))
        return trainer_instance(sft.SFTTrainer, accelerator=accelerator, model=engine, aux_loss_enabled=False,
                                _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)

    return trainer_client("trl", version, "SFTTrainer", "its SFTTrainer", make_trainer, why_not_called)


def find_axolotl(version: str) -> Client:

    def make_trainer(base, engine, accelerator):
        # What compute_loss reads on the sp path: no token counting, no packing, no ORPO, no multimodal ids.
        args = types.SimpleNamespace(include_tkps=False, sample_packing=False, orpo_alpha=None)
        return trainer_instance(base.AxolotlTrainer, accelerator=accelerator, model=engine, args=args,
                                _inject_mm_token_type_ids=False, _model_type="llama")

    return trainer_client("axolotl", version, "AxolotlTrainer", "its trainer", make_trainer)


def find_arctic_training(version: str) -> Client:
    fn_name = "arctic_training.trainer.sft_trainer.SFTTrainer.loss"
    try:
        sft = importlib.import_module("arctic_training.trainer.sft_trainer")
        fn = sft.SFTTrainer.loss
    except Exception as err:  # noqa: BLE001
        return Client("arctic_training", version, fn_name, error=error_line(err))

    def call(engine, batch, sp_group, sp, ds_config):
        # SFTTrainer.loss is wrapped by ArcticTraining's callback mixin: a trainer with no callbacks registered.
        trainer = types.SimpleNamespace(
            device=engine.device, model=engine, model_unwrapped=engine.module, sp_group=sp_group, sp_world_size=sp,
            config=types.SimpleNamespace(sequence_parallel_size=sp, model=types.SimpleNamespace(type="causal")),
            _run_callbacks=lambda name, args, kwargs: (args, kwargs))
        return fn(trainer, {k: v for k, v in batch.items() if k != "labels"})

    # Measured (0.8.0 on DeepSpeed 0.19.8): the trunk's gradients follow the rule exactly; lm_head's does not.
    lm_head = ("not the sp recipe's scale: SFTTrainer.loss's tiled logits+loss (DeepSpeed's TiledFusedLogitsLoss) "
               "computes lm_head's gradient inside forward with an incoming gradient of 1.0 and never rescales it "
               "(backward scales only the hidden states' gradient), so it is the gradient of the loss-token sum")
    return Client("arctic_training", version, fn_name, call, classify(client_source(fn)),
                  exclude={"lm_head.weight": lm_head})


def find_accelerate(version: str) -> Client:
    try:
        spec = importlib.util.find_spec(ACCELERATE_SCRIPT)
    except Exception as err:  # noqa: BLE001
        return Client("accelerate", version, ACCELERATE_SCRIPT, error=error_line(err))
    if spec is None or not spec.origin:
        return Client(
            "accelerate", version, "-",
            why_not=f"accelerate {version} has no {ACCELERATE_SCRIPT} (no ALST recipe shipped) and no sp "
            "loss code of its own")
    why = (module_level_recipe(Path(spec.origin).read_text())
           or "its loss code is in a function this reproducer does not know how to call yet")
    return Client("accelerate", version, ACCELERATE_SCRIPT, why_not=why)


def module_level_recipe(source: str) -> str:
    """Why a script's all_gather recipe cannot be imported as a function ('' if it is inside one)."""
    tree = ast.parse(source)
    in_functions = {
        id(n)
        for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
    }
    gathers = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "all_gather"]
    if gathers and all(id(n) not in in_functions for n in gathers):
        functions = sorted(f.name for f in tree.body if isinstance(f, ast.FunctionDef))
        return ("the all_gather loss recipe is module-level code of a training script (importing it builds an "
                "Accelerator, loads a hub model and trains); its functions are only "
                f"{', '.join(functions) or 'none'}, none computes the loss; accelerate has no sp loss code of its own")
    return ""


def find_clients() -> list[Client]:
    """The installed clients of ``CLIENTS``, in its order (a distribution's name is matched normalised)."""
    finders = dict(transformers=find_transformers, accelerate=find_accelerate, arctic_training=find_arctic_training,
                   trl=find_trl, axolotl=find_axolotl)
    return [finders[spec.name](version) for spec in CLIENTS if (version := dist_version(spec.dist)) is not None]


def run_client(client: Client, stage: int, model_dir: Path, mpu, sp: int, dp_index: int,
               notes: dict[str, str]) -> tuple[dict[str, object], list[str]]:
    """One engine, one step, the client's loss: ({param: full gradient (float64, CPU)}, functions reached)."""
    from repro.harness.engine import destroy_engine, full_gradients

    engine, config = alst_measure.sp_engine(stage, model_dir, mpu, sp)
    try:
        shard, sp_group, _ = alst_measure.sp_shard(engine, dp_index, notes)
        batch = {k: shard[k].to(engine.device) for k in ("input_ids", "position_ids", "shift_labels")}
        codes = dict([client.reaches]) if client.reaches else {}
        loss, reached = codes_called(functools.partial(client.call, engine, batch, sp_group, sp, config), codes)
        engine.backward(loss)
        grads = full_gradients(engine, list(alst_measure.PARAMS), f"zero{stage} {client.name}: ")
        return {name: grad.detach().double().cpu().clone() for name, _, grad in grads}, reached
    finally:
        destroy_engine(engine)
        del engine
        gc.collect()


def measured_row(client: Client, stage: int, grads: dict, expected_grads: dict, sp: int, assume_fixed: bool,
                 deepspeed_version: str, marker: bool, reached: list[str] = ()) -> ClientRow:
    """The row: the fit of all compared gradients at once against the rule's value. A wrapping entry that did not
    reach the loss function it was classified by cannot match the rule."""
    import torch

    fitted = [p for p in alst_measure.PARAMS if p not in client.exclude]
    observed = torch.cat([grads[p].flatten() for p in fitted])
    baseline = torch.cat([expected_grads[p].flatten() for p in fitted])
    target = expected_ratio(client.kind, stage, sp, assume_fixed, deepspeed_version, marker)
    f = fit(observed, baseline, target)
    per_param = {p: scales.fit(grads[p], expected_grads[p]).ratio for p in alst_measure.PARAMS}
    notes = [
        f"{p} left out of the fit (measured ratio {per_param[p]:.4g}): {why}" for p, why in client.exclude.items()
    ]
    missed = client.reaches is not None and client.reaches[0] not in reached
    if missed:
        notes.append(f"the entry did not reach {client.reaches[0]}, whose recipe the rule was given")
    return ClientRow(client=client.name, client_version=client.version, function=client.function, stage=stage,
                     status="measured", **dataclasses.asdict(client.kind),
                     reached=client.reaches[0] if client.reaches and not missed else None,
                     compensates=compensates(client.kind, deepspeed_version, marker) if stage == 3 else False,
                     ratio=f.scalar.ratio, residual=f.scalar.residual, param_ratios=per_param, expected=target,
                     matches_rule=f.ok and not missed, note="; ".join(notes))


def measure_all(clients: list[Client], model_dir: Path, mpu, sp: int, dp_index: int, expected_grads: dict,
                assume_fixed: bool, deepspeed_version: str, marker: bool, notes: dict[str, str]) -> list[ClientRow]:
    """Every client's rows; ``notes`` gets what the report's extra should say about how it ran."""
    rows: list[ClientRow] = []
    for client in clients:
        if client.call is None:
            status, note = ("error", client.error) if client.error else ("not-applicable", client.why_not)
            rows.append(
                ClientRow(client=client.name, client_version=client.version, function=client.function, stage=None,
                          status=status, note=note))
            continue
        for stage in STAGES:
            grads, reached = run_client(client, stage, model_dir, mpu, sp, dp_index, notes)
            rows.append(
                measured_row(client, stage, grads, expected_grads, sp, assume_fixed, deepspeed_version, marker,
                             reached))
    return rows


def program(ctx: launch.RankContext) -> launch.RankResult:
    if reason := alst_measure.skip_reason():
        raise launch.SkipRank(reason)
    # transformers 5.25 loads hub kernels by default (needs a `kernels` PyPI lacks); the tiny model uses none.
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    import torch

    clients = find_clients()
    sp, dp = ctx.topology.sp, ctx.topology.dp
    dp_index = ctx.rank // sp
    # Rank 0 saves the model first: two ranks saving a new transformers version's copy at once were seen to
    # make the other rank read a config.json without model_type (transformers 5.24, first run).
    if ctx.rank == 0:
        tiny_llama.build(tiny_llama.default_model_dir())
    torch.distributed.barrier()
    model_dir = tiny_llama.build(tiny_llama.default_model_dir())
    # The baseline first: registering Ulysses replaces the sdpa attention function process-wide.
    _, expected = alst_measure.baseline(model_dir, dp, ctx.device)
    mpu = alst_measure.register_ulysses(model_dir, sp)
    fixed, marker = deepspeed_state()
    ds_version = dist_version("deepspeed") or "none"
    notes: dict[str, str] = {}
    rows = measure_all(clients, model_dir, mpu, sp, dp_index, expected, ctx.args.expect == "fixed", ds_version, marker,
                       notes)
    report = DownstreamReport(
        **launch.launch_fields(ctx, SCRIPT), deepspeed_fixed=fixed, marker=marker, rows=rows,
        extra=dict(model=alst_measure.MODEL, seq_len=alst_measure.SEQ_LEN, masked_prefix=alst_measure.MASKED_PREFIX,
                   params=list(alst_measure.PARAMS), zero_config=alst_measure.ZERO_CONFIG, dtype="float32",
                   callers=CALLERS, **notes))
    return launch.RankResult(1 if report.exit_code == 1 else 0, report.to_dict() if ctx.rank == 0 else None)
