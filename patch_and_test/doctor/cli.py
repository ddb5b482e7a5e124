"""zero3-sp doctor --config FILE [--sp N] [--model CONFIG | --param-sizes N,N,...]

Am I affected? Reads the DeepSpeed installed in this Python (its code, not its version number), the
run's config (a DeepSpeed JSON, with HF's "auto" values; an accelerate config, `accelerate launch
--config_file`; or an ArcticTraining YAML), optionally the model's parameter sizes, and the loss code
(the installed clients' sp loss recipes: transformers, accelerate, trl, ArcticTraining, axolotl; the
trainer an ArcticTraining config names; or --recipe); prints per class of parameters the reduce path
and the gradient factor now and after the fix (1 = the true gradient), a verdict and the remedy.
sp is what the file states (--sp must then agree), else --sp. No GPU, no training step.

exit codes:
  0  not affected: every gradient is the true gradient with this DeepSpeed, config and loss code
  1  affected: some gradient is not (the factor, the parameters and the remedy are printed)
  2  bad input, one line on stderr: a missing or malformed config (or one of none of the three kinds),
     sp < 1, missing, or --sp disagreeing with the file, a DeepSpeed it cannot read, an "auto" it needs
     and cannot fill
  3  it depends on parameter sizes not given: parameters above reduce_bucket_size get another factor
     than the others; the verdict line says which of a typical model's are above it (--model or
     --param-sizes decide)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from patch_and_test.doctor import read, rule
from patch_and_test.core.errors import CommandParser, BadInput
from patch_and_test import PACKAGE_ROOT
from patch_and_test.core.series import parse_version, series_for_version
from patch_and_test.core.source import load_lock
from patch_and_test.downstream.clients import FoundClient
from repro.downstream.expect import mis_scaled
from repro.harness.report import text_table
from repro.harness.scales import RECIPES, ReducePath, label


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="zero3-sp doctor", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config", "--ds-config", dest="config", type=Path, required=True,
        help="the run's config: a DeepSpeed config JSON, an accelerate config (YAML or JSON) or an ArcticTraining "
        "YAML (YAML by its .yaml/.yml suffix)")
    parser.add_argument("--sp", type=int, default=None,
                        help="sequence-parallel size, where the config does not state it (else it must agree)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "--model", default=None,
        help="a transformers config (config.json, its folder, or a hub name) built on the meta device, "
        "no weights: its parameter sizes and hidden size (for \"auto\")")
    sizes.add_argument("--param-sizes", default=None, help="parameter sizes in elements, comma-separated")
    parser.add_argument(
        "--recipe", choices=RECIPES, default=None,
        help="your loss recipe, instead of the installed clients': none/own_share (each rank "
        "backprops its token-weighted share), allgather (a differentiable all_gather of the loss)")
    parser.add_argument("--deepspeed", type=Path, default=None,
                        help="a DeepSpeed tree to read instead of the installed one")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        lines, code = diagnose(build_parser().parse_args(argv))
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines), flush=True)
    return code


def diagnose(args: argparse.Namespace) -> tuple[list[str], int]:
    """The report's lines and the exit code; BadInput for anything it cannot decide with."""
    if args.sp is not None and args.sp < 1:
        raise BadInput(f"--sp must be >= 1, got {args.sp}")
    run = read.read_config(args.config)
    sp = read.sequence_parallel_size(run, args.sp, args.config)
    sizes = read.parse_param_sizes(args.param_sizes) if args.param_sizes else None
    installed = read.find_deepspeed(args.deepspeed)
    if args.model:
        sizes = read.model_sizes(args.model)
    clients = [] if args.recipe else read.installed_clients()
    sources = [source for _, source in clients if source is not None]
    if run.loss is not None and not args.recipe:  # the trainer the file names: its loss, as installed or read
        sources = [s for s in sources if s.client == run.loss.client] or [run.loss]
    if args.recipe or not sources:
        sources = [rule.own_loss(args.recipe or "none")]
    params = list(sizes.params) if sizes else None
    result = read.run_check(run.deepspeed, sp, installed.state, sources, params, sizes.hidden_size if sizes else None,
                            installed.defaults, installed.defaults_from)
    z, verdict, ds = result.zero, result.verdict, installed.state
    where = f"the tree {installed.package}" if args.deepspeed else "installed here"
    lines = [
        f"DeepSpeed {ds.version} ({where}): fix {'present' if ds.fixed else 'absent'}, marker "
        f"ZERO3_SP_GRADIENTS_SUMMED {'set' if ds.marker else 'absent'} (read from runtime/zero/stage3.py)"
    ]
    lines += (_config_lines(args.config, run, z, sp, sizes) + _client_lines(clients, args.recipe, sources, run) +
              _table(list(verdict.cells)) + _verdict_lines(verdict, z) +
              _remedy_lines(verdict, z, sources, sp, ds, params))
    return lines, verdict.exit_code


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _config_lines(path: Path, run: read.RunConfig, z: rule.ZeroSettings, sp: int,
                  sizes: read.ModelSizes | None) -> list[str]:
    keys = rule.PATH_KEYS if z.stage == 3 else ("stage", )
    shown = ", ".join(f"{k}={_value(getattr(z, k))}" + ("" if z.where(k) == "config" else f" ({z.where(k)})")
                      for k in keys)
    lines = [f"config {path} ({run.kind}): {shown}; sp={sp} ({'--sp' if run.sp is None else run.sp_where})"]
    notes = list(run.notes)
    if z.zero_quantized_gradients and z.stage == 3:
        notes.append("zero_quantized_gradients (qgZ) reduces inside __avg_scatter_grads (all_to_all_quant_reduce "
                     "across nodes): the same path and factor; not measured here (it needs several nodes)")
    if z.zero_quantized_weights or z.zero_hpz_partition_size > 1:
        notes.append("zero_quantized_weights / zero_hpz_partition_size concern parameters, not gradients: no effect")
    if z.gradient_predivide_factor != 1.0 or z.prescale_gradients:
        notes.append(f"gradient_predivide_factor={z.gradient_predivide_factor}, prescale_gradients="
                     f"{_value(z.prescale_gradients)}: not in this check; other upstream discrepancies with these "
                     "knobs: repro/audit/known_discrepancies.toml")
    if sizes is not None:
        notes.append(f"parameters: {sizes.label}, {len(sizes.params)} tensors")
    return lines + [f"  note: {n}" for n in notes]


def _client_lines(clients: list[tuple[FoundClient, rule.LossSource | None]], recipe: str | None,
                  sources: list[rule.LossSource], run: read.RunConfig) -> list[str]:
    lines = []
    for c, _ in clients:  # judged: by its kind (None: not judged)
        what = f"judged: {rule.RECIPE_WORDS[c.kind.kind]}{_gate(c.kind)}" if c.kind else "not judged"
        lines.append(f"client {c.name} {c.version}: {what}" + (f" ({c.note})" if c.note else ""))
    if recipe:
        lines.append(f"loss: --recipe {recipe}: {sources[0].label}")
    elif run.loss is not None:
        how = ("judged from its installed code" if sources != [run.loss] else
               f"{run.loss.client} is not installed here, so its recipe in arctic-training 0.8.0 is assumed: the "
               f"{rule.RECIPE_WORDS[run.loss.kind.kind]} (--recipe if your loss differs)")
        lines.append(f"loss: {sources[0].label}, the {run.kind}'s trainer, {how}")
    elif len(sources) == 1 and sources[0].client is None:
        lines.append(f"loss: no installed client has sp loss code: {sources[0].label} assumed (--recipe allgather if "
                     "you gather the loss with the differentiable all_gather)")
    return lines


def _gate(kind) -> str:
    if kind.gate == "none":
        return ""
    return f", x sp on ZeRO-3 while {'the marker is absent and ' if kind.gate == 'marker-or-version' else ''}" \
           f"deepspeed < {kind.gate_version}"


def _table(cells: list[rule.Cell]) -> list[str]:

    def params(c: rule.ParamClass) -> str:
        largest = ", ".join(f"{name} {n}" for name, n in c.largest[:2])
        return c.label + (f" (largest: {largest})" if c.largest and not c.every else "")

    header = ("params", "path", "loss", "now", "after the fix")
    rows = [(params(c.param_class), str(c.param_class.path), c.source.label, label(c.now), label(c.after_fix))
            for c in cells]
    return ["gradient / true gradient:"] + ["  " + line for line in text_table(header, rows)]


def _verdict_lines(verdict: rule.Verdict, z: rule.ZeroSettings) -> list[str]:
    bad = [c for c in verdict.cells if mis_scaled(c.now)]
    if verdict.affected is None:
        return [_depends_line(verdict, z)]
    if not verdict.affected:
        return ["verdict: not affected: every gradient is the true gradient"]
    parts = []
    for c in bad:
        why = []
        if mis_scaled(c.deepspeed_now):
            why.append(f"{c.param_class.path} without the fix divides by sp x dp, not dp")
        if mis_scaled(c.now / c.deepspeed_now):
            why.append(f"the loss recipe x{label(c.now / c.deepspeed_now)}")
        scope = " (if your model has any)" if c.param_class.present is None else ""
        parts.append(f"{label(c.now)} x the true gradient for {c.param_class.label}{scope} with "
                     f"{c.source.label}: {'; '.join(why)}")
    return ["verdict: AFFECTED: " + "; ".join(parts)]


def _depends_line(verdict: rule.Verdict, z: rule.ZeroSettings) -> str:
    """The bucket's two sides and what each gets; which of a typical model's usual parameters lie above it."""

    def side(path: ReducePath) -> str:
        cells = [c for c in verdict.cells if c.param_class.path is path]
        return f"takes {path}: " + ", ".join(f"{label(c.now)} x the true gradient" +
                                             (f" with {c.source.label}" if len(cells) > 1 else "") for c in cells)

    def named(path: ReducePath) -> list[str]:
        return [f"{name} ({k:,} elements)" for name, k in t.params() if rule.reduce_path(z, k) is path]

    n, t = z.reduce_bucket_size, rule.TYPICAL
    above, below = named(ReducePath.AVG_SCATTER), named(ReducePath.CONTIGUOUS)
    typical = f"in {t.name} (hidden {t.hidden_size}, vocab {t.vocab_size}, intermediate {t.intermediate_size}) " + (
        f"{' and '.join(above)} {'are' if len(above) > 1 else 'is'} above it"
        if above else "none of these is above it")
    if below:
        typical += f"; {' and '.join(below)} and every smaller weight are not"
    return (f"verdict: DEPENDS ON PARAMETER SIZES: a parameter of more than {n:,} elements (reduce_bucket_size) "
            f"{side(ReducePath.AVG_SCATTER)}; one of at most {n:,} {side(ReducePath.CONTIGUOUS)}; {typical}; pass "
            "--model or --param-sizes for yours")


def _remedy_lines(verdict: rule.Verdict, z: rule.ZeroSettings, sources: list[rule.LossSource], sp: int,
                  ds: rule.DeepSpeedState, params: list[tuple[str, int]] | None) -> list[str]:
    lines = []
    needs_fix = any(mis_scaled(c.deepspeed_now) for c in verdict.cells if c.param_class.present is not False)
    if verdict.affected is not False and needs_fix:
        lines += _series_remedy(ds.version)
        if z.stage == 3:
            alt, alt_classes = rule.workaround(z, params)
            if not any(mis_scaled(c.now) for c in rule.cells(alt, alt_classes, sources, sp, ds)):
                bucket = alt.reduce_bucket_size if params else "your largest parameter's element count"
                lines.append("  or, without a patch: zero_optimization reduce_scatter: false, contiguous_gradients: "
                             f"true, reduce_bucket_size >= {bucket} (every gradient then takes "
                             "__avg_scatter_contiguous_grads, which sums over sp; it holds a buffer of that many "
                             "elements)")
    for source in sources:
        after = [c for c in verdict.cells if c.source == source and mis_scaled(c.after_fix)]
        if after:
            remedy = rule.client_remedy(source, sp)
            lines.append(f"remedy: {remedy}" if verdict.affected else f"before you take the fix: {remedy}; with the "
                         f"fix its gradients become {label(after[0].after_fix)} x the true gradient")
    return lines


def _series_remedy(version: str) -> list[str]:
    try:
        series = series_for_version(version)
    except BadInput as err:
        return [f"remedy: no series here for DeepSpeed {version}: {err}"]
    folder = series.directory.relative_to(PACKAGE_ROOT) if series.directory.is_relative_to(PACKAGE_ROOT / "patches") \
        else series.directory  # the checkout's patches/, else where they are (an installed wheel's copy)
    release = ".".join(map(str, parse_version(version)))
    checked = (f"DEEPSPEED_VERSION={release} tox -e patch-and-test"
               if release in load_lock() else "DEEPSPEED_SRC=/path/to/your/DeepSpeed tox -e patch-and-test")
    return [
        f"remedy: DeepSpeed {version} needs the series {series.name} (v{series.version}, {folder}/, for "
        f"{series.range_text}):",
        f"  built and checked from this repository: {checked} (the patched DeepSpeed stays in .tox/patch-and-test)",
        f"  by hand: in a DeepSpeed checkout `git am {folder}/000[1-9]-*.patch`; on the PyPI sdist (a git repository "
        f"of it) `git am --exclude='tests/*' --exclude='docs/*' {folder}/000[1-9]-*.patch` (the fix and the marker; "
        f"the test patches become empty commits), then `DS_BUILD_OPS=0 pip install --no-build-isolation .`"
    ]
