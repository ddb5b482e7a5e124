"""The parity audit's configuration space (docs/parity-audit.md, "The point space"): points, quick/full selection,
grouping by topology. Pure logic, no torch, no DeepSpeed; a point is one ``deepspeed.initialize`` + backward."""

from __future__ import annotations

import fnmatch
import itertools
from typing import Iterable, Literal, Sequence

from pydantic import computed_field, model_validator

from repro.gradscale.space import ZeroConfig
from repro.harness.report import Record
from repro.harness.topology import Topology

STAGES = (0, 1, 2, 3)
BUCKET_SIZES = {"fits": 500, "overflow": 16}  # the names are AuditPoint.bucket's
DTYPES = ("fp32", "bf16")
GAS_VALUES = (1, 2)
PREDIVIDE_LEVELS = ("1", "world", "3")
SP_VALUES = (1, 2, 4)
DP_VALUES = (1, 2)
MAX_WORLD = 4
MODES = ("quick", "full")


def topologies(world_sizes: Iterable[int] | None = None, sps: Iterable[int] | None = None) -> list[Topology]:
    """Every (world, sp) of the space, optionally restricted; ordered by world size, then sp."""
    world_sizes, sps = (None if x is None else set(x) for x in (world_sizes, sps))
    return sorted(
        Topology(sp * dp, sp) for sp, dp in itertools.product(SP_VALUES, DP_VALUES)
        if sp * dp <= MAX_WORLD and (world_sizes is None or sp * dp in world_sizes) and (sps is None or sp in sps))


class AuditPoint(Record):
    """A configuration point: one ``deepspeed.initialize`` + backward (world, predivide_factor and
    reduce_bucket_size derived); a known-discrepancy predicate tests these fields."""

    model_config = dict(Record.model_config, json_schema_serialization_defaults_required=True)  # always written

    stage: int
    reduce_scatter: bool | None
    contiguous_gradients: bool | None
    bucket: Literal["fits", "overflow"] | None
    sp: int
    dp: int
    dtype: Literal["fp32", "bf16"] = "fp32"
    gas: int = 1
    predivide: Literal["1", "world", "3"] = "1"
    prescale: bool = False

    def __init__(self, *args, **kwargs):
        super().__init__(**dict(zip(type(self).model_fields, args)), **kwargs)

    @model_validator(mode="after")
    def _knobs(self) -> AuditPoint:
        if self.stage not in STAGES:
            raise ValueError(f"stage {self.stage} not in {STAGES}")
        if {k is None for k in (self.reduce_scatter, self.contiguous_gradients, self.bucket)} != {self.stage == 0}:
            raise ValueError("stage 0 takes no reduce_scatter / contiguous_gradients / bucket, other stages all three")
        return self

    @property
    def topo(self) -> Topology:
        return Topology(self.world, self.sp)

    @computed_field
    @property
    def world(self) -> int:
        return self.sp * self.dp

    @computed_field
    @property
    def predivide_factor(self) -> float:
        return {"1": 1.0, "world": float(self.world), "3": 3.0}[self.predivide]

    @computed_field
    @property
    def reduce_bucket_size(self) -> int | None:
        return None if self.bucket is None else BUCKET_SIZES[self.bucket]

    @property
    def id(self) -> str:
        """Stable, shell-friendly name, e.g. ``z3.rs0.cg1.overflow/sp2dp1/bf16/gas2/pdf=world/prescale``."""
        rs, cg = int(bool(self.reduce_scatter)), int(bool(self.contiguous_gradients))
        knobs = "" if self.stage == 0 else f".rs{rs}.cg{cg}.{self.bucket}"
        scale = "prescale" if self.prescale else "postscale"
        return f"z{self.stage}{knobs}/{self.topo.label()}/{self.dtype}/gas{self.gas}/pdf={self.predivide}/{scale}"

    def zero_section(self) -> dict:
        return ZeroConfig(self.stage, self.reduce_scatter, self.contiguous_gradients,
                          self.reduce_bucket_size).zero_section()

    def config_overrides(self) -> dict:
        """Top-level DeepSpeed config keys this point sets (besides zero_optimization)."""
        out: dict = dict(gradient_accumulation_steps=self.gas, gradient_predivide_factor=self.predivide_factor,
                         prescale_gradients=self.prescale)
        if self.dtype == "bf16":
            out["bf16"] = {"enabled": True}
        return out


def full_space(topos: Sequence[Topology]) -> list[AuditPoint]:
    points = []
    for topo, stage in itertools.product(topos, STAGES):
        zero_knobs = [(None, None, None)] if stage == 0 else itertools.product(*[(True, False)] * 2, BUCKET_SIZES)
        levels = [p for p in PREDIVIDE_LEVELS if not (p == "world" and topo.world_size == 1)]
        knobs = itertools.product(zero_knobs, DTYPES, GAS_VALUES, itertools.product(levels, (False, True)))
        points += [AuditPoint(stage, *rcb, topo.sp, topo.dp, dtype, gas, *scale) for rcb, dtype, gas, scale in knobs]
    return points


def quick_rule(p: AuditPoint) -> bool:
    """Which full-space points the quick mode keeps (docs/parity-audit.md); world size 1 keeps only each stage's
    default path: nothing is reduced there."""
    base = p.dtype == "fp32" and p.gas == 1 and p.predivide == "1" and not p.prescale
    default_path = p.stage == 0 or (p.reduce_scatter and p.contiguous_gradients and p.bucket == "fits")
    mixed_bucket = p.stage == 3 and not p.reduce_scatter and p.contiguous_gradients and p.bucket == "overflow"
    if p.world == 1:
        return base and default_path
    if base:
        return True
    numerics = p.dtype == "bf16" and p.gas == 2 and p.predivide == "1" and not p.prescale
    if numerics:
        return default_path or mixed_bucket
    if p.dtype != "fp32" or p.gas != 1:
        return False
    # scaling knobs, fp32 gas 1
    honours = p.stage == 0 or (not p.reduce_scatter and p.contiguous_gradients)
    if p.stage == 3 and not p.reduce_scatter and not p.contiguous_gradients and p.bucket == "fits":
        honours = True  # ZeRO-3's __avg_scatter_grads with a predivide factor
    if honours and (p.stage in (0, 3) or p.bucket == "fits"):
        return True
    # one rejected combination per rejecting stage
    return (p.stage in (2, 3) and p.reduce_scatter and p.contiguous_gradients and p.bucket == "fits"
            and p.predivide == "world" and not p.prescale)


def select(mode: str, topos: Sequence[Topology], stages: Iterable[int] | None = None,
           dtypes: Iterable[str] | None = None, gas: Iterable[int] | None = None,
           patterns: Iterable[str] | None = None) -> list[AuditPoint]:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not in {MODES}")
    points = [p for p in full_space(topos) if mode == "full" or quick_rule(p)]
    stages, dtypes, gas = (set(x) if x else None for x in (stages, dtypes, gas))
    patterns = list(patterns or [])
    return [
        p for p in points if (stages is None or p.stage in stages) and (dtypes is None or p.dtype in dtypes) and (
            gas is None or p.gas in gas) and (not patterns or any(fnmatch.fnmatchcase(p.id, pat) for pat in patterns))
    ]


def group_by_topology(points: Iterable[AuditPoint]) -> dict[Topology, list[AuditPoint]]:
    """Points per (world, sp), topologies in ascending order, points in their given order."""
    by_topo = sorted(points, key=lambda p: p.topo)  # stable: each topology's points keep their order
    return {topo: list(group) for topo, group in itertools.groupby(by_topo, key=lambda p: p.topo)}
