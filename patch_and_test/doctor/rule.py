"""The doctor's logic: which reduce path each parameter takes, the factor it gets, the verdict, the remedy. Pure.

The path rule and the factor: docs/doctor.md, "The rule" (the factor is ``repro.harness.scales``'s, not restated).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from repro.downstream.expect import ClientKind, client_scale, mis_scaled
from repro.harness import scales
from repro.harness.scales import ReducePath

# The ZeRO keys the path rule reads, in the order they are shown.
PATH_KEYS = ("stage", "reduce_scatter", "contiguous_gradients", "reduce_bucket_size")
ZEROPP_KEYS = ("zero_quantized_gradients", "zero_quantized_weights", "zero_hpz_partition_size")


@dataclasses.dataclass(frozen=True)
class ZeroSettings:
    """The ZeRO knobs the gradient reduction depends on, as DeepSpeed will see them."""
    stage: int
    reduce_scatter: bool
    contiguous_gradients: bool
    reduce_bucket_size: int | None  # None: "auto" left unfilled (no model to fill it from)
    zero_quantized_gradients: bool = False
    zero_quantized_weights: bool = False
    zero_hpz_partition_size: int = 1
    gradient_predivide_factor: float = 1.0
    prescale_gradients: bool = False
    origin: tuple[tuple[str, str], ...] = ()  # (key, "config" | "default" | "auto: ...")

    def where(self, key: str) -> str:
        return dict(self.origin).get(key, "config")

    @property
    def bucket_decides(self) -> bool:
        """Whether a parameter's size decides its path (ZeRO-3, contiguous_gradients, not reduce_scatter)."""
        return self.stage == 3 and self.contiguous_gradients and not self.reduce_scatter


@dataclasses.dataclass(frozen=True)
class DeepSpeedState:
    """The installed DeepSpeed, as read from its code."""
    version: str
    fixed: bool  # stage3.py's __avg_scatter_grads accounts for sequence parallelism
    marker: bool  # stage3.py sets ZERO3_SP_GRADIENTS_SUMMED = True

    @property
    def expect(self) -> str:
        return "fixed" if self.fixed else "buggy"

    def with_fix(self) -> DeepSpeedState:
        """The same release with a series applied: its patch 0001 adds the fix and the marker, not a new version."""
        return dataclasses.replace(self, fixed=True, marker=True)


@dataclasses.dataclass(frozen=True)
class LossSource:
    """Whose loss code turns the sp ranks' shard losses into what each rank backprops."""
    label: str  # e.g. "transformers 5.24.0", "your own loss"
    kind: ClientKind
    client: str | None = None  # the distribution, for the remedy; None: the user's own code


RECIPE_WORDS = {"allgather": "differentiable all_gather of the loss", "own_share": "each rank's token-weighted share"}


def own_loss(recipe: str) -> LossSource:
    """The user's own loss code, described by one of the rule's recipes ("none" is a plain loss: its own share)."""
    if recipe not in scales.RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(scales.RECIPES)}")
    kind = "allgather" if recipe == "allgather" else "own_share"
    return LossSource(f"your own loss ({RECIPE_WORDS[kind]})", ClientKind(kind))


def reduce_path(z: ZeroSettings, numel: int | None) -> ReducePath | None:
    """The method that reduces a parameter with ``numel`` elements; None when the size decides and is unknown."""
    if z.stage == 0:
        return ReducePath.STAGE_0
    if z.stage in (1, 2):
        return ReducePath.STAGE_1_2
    if z.stage != 3:
        raise ValueError(f"ZeRO stage {z.stage} does not exist")
    if not z.bucket_decides:
        return ReducePath.AVG_SCATTER
    if numel is None or z.reduce_bucket_size is None:
        return None
    return ReducePath.CONTIGUOUS if numel <= z.reduce_bucket_size else ReducePath.AVG_SCATTER


@dataclasses.dataclass(frozen=True)
class ParamClass:
    """Parameters that take one reduce path."""
    label: str
    path: ReducePath
    count: int | None  # None: the sizes are unknown
    largest: tuple[tuple[str, int], ...] = ()  # up to three (name, elements), largest first
    every: bool = False  # the class holds every parameter (so it is present whatever the sizes)

    @property
    def present(self) -> bool | None:
        """Whether the model has a parameter in this class; None when the sizes that decide it are unknown."""
        return True if self.every else (None if self.count is None else self.count > 0)


def param_classes(z: ZeroSettings, params: Sequence[tuple[str, int]] | None) -> list[ParamClass]:
    """The classes of ``params`` (name, elements) by reduce path; without sizes, the classes the rule knows."""
    if not z.bucket_decides:
        path = reduce_path(z, None)
        knob = "reduce_scatter=true" if z.reduce_scatter else "contiguous_gradients=false"
        why = f"ZeRO-{z.stage}" if z.stage < 3 else f"ZeRO-3, {knob}"
        count = None if params is None else len(params)
        label = f"all ({why})" if params is None else f"all {count} ({why})"
        return [ParamClass(label, path, count, _largest(params or ()), every=True)]
    if z.reduce_bucket_size is None:
        raise ValueError("reduce_bucket_size is needed to split the parameters")
    n, sides = z.reduce_bucket_size, (("<=", ReducePath.CONTIGUOUS), (">", ReducePath.AVG_SCATTER))
    if params is None:
        return [ParamClass(f"{op} {n} elements", path, None) for op, path in sides]
    groups = (([p for p in params if reduce_path(z, p[1]) is path], op, path) for op, path in sides)
    return [ParamClass(f"{len(g)} {op} {n} elements", path, len(g), _largest(g)) for g, op, path in groups if g]


def _largest(params: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(params, key=lambda p: -p[1])[:3])


def factor(path: ReducePath, sp: int, stage: int, ds: DeepSpeedState, source: LossSource) -> float:
    """The gradient over the true gradient: the rule, with the client's gate for this DeepSpeed."""
    return client_scale(source.kind, path, stage, sp, ds.expect, ds.version, ds.marker)


@dataclasses.dataclass(frozen=True)
class Cell:
    param_class: ParamClass
    source: LossSource
    now: float  # with the DeepSpeed installed here
    after_fix: float  # with a series applied to it
    deepspeed_now: float  # DeepSpeed's own factor on this path (1/sp on the buggy path)


def cells(z: ZeroSettings, classes: Sequence[ParamClass], sources: Sequence[LossSource], sp: int,
          ds: DeepSpeedState) -> list[Cell]:
    fixed = ds.with_fix()
    return [
        Cell(c, s, factor(c.path, sp, z.stage, ds, s), factor(c.path, sp, z.stage, fixed, s),
             float(scales.deepspeed_factor(c.path, sp, ds.expect))) for c in classes for s in sources
    ]


@dataclasses.dataclass(frozen=True)
class Verdict:
    affected: bool | None  # None: it depends on parameter sizes that were not given
    cells: tuple[Cell, ...]

    @property
    def exit_code(self) -> int:
        """0 not affected, 1 affected, 3 it depends on parameter sizes (2 is bad input, the command's)."""
        return {False: 0, True: 1, None: 3}[self.affected]


def verdict(rows: Sequence[Cell]) -> Verdict:
    """Affected iff a class of parameters that is present gets a factor other than 1 now."""
    if any(mis_scaled(c.now) for c in rows if c.param_class.present):
        return Verdict(True, tuple(rows))
    unknown = {mis_scaled(c.now) for c in rows if c.param_class.present is None}
    # one class is right, the other is not: sizes decide
    return Verdict(None if unknown == {True, False} else True in unknown, tuple(rows))


@dataclasses.dataclass(frozen=True)
class TypicalModel:
    """A published decoder architecture's shapes: which of its usual parameters a bucket size splits off."""
    name: str
    hidden_size: int
    vocab_size: int
    intermediate_size: int

    def params(self) -> list[tuple[str, int]]:
        """Its embeddings, lm_head (untied) and largest other weight (each MLP projection): (name, elements)."""
        embed = self.vocab_size * self.hidden_size
        return [("embed_tokens", embed), ("lm_head", embed),
                ("mlp.gate_proj/up_proj/down_proj", self.hidden_size * self.intermediate_size)]


TYPICAL = TypicalModel("Llama-3-8B", hidden_size=4096, vocab_size=128256, intermediate_size=14336)


def workaround(z: ZeroSettings, params: Sequence[tuple[str, int]] | None) -> tuple[ZeroSettings, list[ParamClass]]:
    """ZeRO-3 without a patch: reduce_scatter off, contiguous_gradients on, a bucket that fits every parameter
    (without sizes: left to the user, one class of every parameter), so every one takes the contiguous path."""
    largest = max((n for _, n in params), default=0) if params else 0
    alt = dataclasses.replace(z, reduce_scatter=False, contiguous_gradients=True, zero_quantized_gradients=False,
                              reduce_bucket_size=max(z.reduce_bucket_size or 0, largest) or None)
    if params:
        return alt, param_classes(alt, params)
    return alt, [ParamClass("all (each within the bucket)", ReducePath.CONTIGUOUS, None, every=True)]


def client_remedy(source: LossSource, sp: int) -> str:
    """What to change in ``source``'s loss code so that its gradients are the true ones with the fix in."""
    if source.kind.kind == "allgather":
        return (f"{source.label}: the loss is aggregated with the differentiable all_gather, whose backward sums "
                f"the sp ranks' gradients (x{sp}): backprop each rank's own token-weighted share, or divide the "
                "gathered loss by sp (docs/downstream-notice.md, 'What they should do'; docs/backport-clients.md)")
    return (f"{source.label}: it multiplies its ZeRO-3 loss share by sp on its gate '{source.kind.gate}' "
            f"(deepspeed < {source.kind.gate_version or '?'}), which a patched build still meets: apply "
            "patches/downstream/transformers (it reads ZERO3_SP_GRADIENTS_SUMMED first), or stay on ZeRO-2 "
            "(docs/backport-clients.md)")
