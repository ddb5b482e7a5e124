"""The parity audit's configuration space: points, quick/full selection, grouping by topology.

Pure logic, no torch, no DeepSpeed. A point is one ``deepspeed.initialize`` + forward/backward:

  stage                 0, 1, 2, 3
  reduce_scatter        True / False          (stages 1-3; None for stage 0)
  contiguous_gradients  True / False          (stages 1-3; None for stage 0)
  bucket                "fits" / "overflow"   (reduce_bucket_size 500 or 16 for the probe's 4- and
                                               64-element parameters; stages 1-3; None for stage 0)
  sp, dp                sp in {1, 2, 4}, dp in {1, 2}, sp * dp <= 4
  dtype                 "fp32" / "bf16"       ("bf16": {"enabled": true})
  gas                   gradient_accumulation_steps 1 / 2
  predivide             "1" / "world" / "3"   gradient_predivide_factor 1.0, the world size (the
                                               value where every stage's "skip the postscale"
                                               shortcut fires), or 3.0 (a generic factor)
  prescale              prescale_gradients False / True

Stage 0 reads none of reduce_scatter / contiguous_gradients / reduce_bucket_size: the engine
reduces through ``allreduce_gradients`` with its own bucket size (MEMORY_OPT_ALLREDUCE_SIZE), so
those knobs are not varied for it. Every stage reads gradient_predivide_factor and
prescale_gradients somewhere (engine.allreduce_bucket, stage_1_and_2.gradient_reduction_w_predivide,
ZeRO-3's two scatter methods); where a stage rejects them (ZeRO-2/3 with reduce_scatter) the
point is run anyway and reported as rejected. With world size 1 the "world" factor is 1.0, the
same as "1", so that level is dropped there.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
from typing import Iterable, Sequence

STAGES = (0, 1, 2, 3)
BUCKET_SIZES = {"fits": 500, "overflow": 16}
DTYPES = ("fp32", "bf16")
GAS_VALUES = (1, 2)
PREDIVIDE_LEVELS = ("1", "world", "3")
SP_VALUES = (1, 2, 4)
DP_VALUES = (1, 2)
MAX_WORLD = 4
MODES = ("quick", "full")


@dataclasses.dataclass(frozen=True, order=True)
class Topo:
    """A (world size, sp) pair: one process group, one launch."""

    world_size: int
    sp: int

    @property
    def dp(self) -> int:
        return self.world_size // self.sp

    def label(self) -> str:
        return f"sp{self.sp}dp{self.dp}"


def topologies(world_sizes: Iterable[int] | None = None, sps: Iterable[int] | None = None) -> list[Topo]:
    """Every (world, sp) of the space, optionally restricted; ordered by world size, then sp."""
    out = []
    for sp, dp in itertools.product(SP_VALUES, DP_VALUES):
        topo = Topo(sp * dp, sp)
        if topo.world_size > MAX_WORLD:
            continue
        if world_sizes is not None and topo.world_size not in set(world_sizes):
            continue
        if sps is not None and topo.sp not in set(sps):
            continue
        out.append(topo)
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class AuditPoint:
    stage: int
    reduce_scatter: bool | None
    contiguous_gradients: bool | None
    bucket: str | None
    sp: int
    dp: int
    dtype: str = "fp32"
    gas: int = 1
    predivide: str = "1"
    prescale: bool = False

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage {self.stage} not in {STAGES}")
        knobs = (self.reduce_scatter, self.contiguous_gradients, self.bucket)
        if self.stage == 0 and any(k is not None for k in knobs):
            raise ValueError("stage 0 takes no reduce_scatter / contiguous_gradients / bucket")
        if self.stage != 0 and any(k is None for k in knobs):
            raise ValueError(f"stage {self.stage} needs reduce_scatter, contiguous_gradients and bucket")
        if self.bucket is not None and self.bucket not in BUCKET_SIZES:
            raise ValueError(f"bucket {self.bucket!r} not in {sorted(BUCKET_SIZES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not in {DTYPES}")
        if self.predivide not in PREDIVIDE_LEVELS:
            raise ValueError(f"predivide {self.predivide!r} not in {PREDIVIDE_LEVELS}")

    @property
    def world_size(self) -> int:
        return self.sp * self.dp

    @property
    def topo(self) -> Topo:
        return Topo(self.world_size, self.sp)

    @property
    def predivide_factor(self) -> float:
        return {"1": 1.0, "world": float(self.world_size), "3": 3.0}[self.predivide]

    @property
    def reduce_bucket_size(self) -> int | None:
        return None if self.bucket is None else BUCKET_SIZES[self.bucket]

    @property
    def id(self) -> str:
        """Stable, shell-friendly name, e.g. ``z3.rs0.cg1.overflow/sp2dp1/bf16/gas2/pdf=world/prescale``."""
        knobs = "" if self.stage == 0 else (f".rs{int(self.reduce_scatter)}.cg{int(self.contiguous_gradients)}"
                                            f".{self.bucket}")
        return "/".join([
            f"z{self.stage}{knobs}",
            self.topo.label(), self.dtype, f"gas{self.gas}", f"pdf={self.predivide}",
            "prescale" if self.prescale else "postscale"
        ])

    def zero_section(self) -> dict:
        section: dict = {"stage": self.stage}
        if self.stage != 0:
            section.update(reduce_scatter=self.reduce_scatter, contiguous_gradients=self.contiguous_gradients,
                           reduce_bucket_size=self.reduce_bucket_size)
        return section

    def config_overrides(self) -> dict:
        """Top-level DeepSpeed config keys this point sets (besides zero_optimization)."""
        out: dict = {
            "gradient_accumulation_steps": self.gas,
            "gradient_predivide_factor": self.predivide_factor,
            "prescale_gradients": self.prescale
        }
        if self.dtype == "bf16":
            out["bf16"] = {"enabled": True}
        return out

    def fields(self) -> dict:
        """What a known-discrepancy predicate may test (see repro.audit.expect)."""
        data = dataclasses.asdict(self)
        data.update(world=self.world_size, predivide_factor=self.predivide_factor,
                    reduce_bucket_size=self.reduce_bucket_size)
        return data

    @classmethod
    def from_fields(cls, data: dict) -> AuditPoint:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def stage_knobs(stage: int) -> list[tuple[bool | None, bool | None, str | None]]:
    if stage == 0:
        return [(None, None, None)]
    return list(itertools.product((True, False), (True, False), tuple(BUCKET_SIZES)))


def scale_knobs(world_size: int) -> list[tuple[str, bool]]:
    levels = [p for p in PREDIVIDE_LEVELS if not (p == "world" and world_size == 1)]
    return list(itertools.product(levels, (False, True)))


def full_space(topos: Sequence[Topo]) -> list[AuditPoint]:
    points = []
    for topo in topos:
        for stage in STAGES:
            for (rs, cg, bucket), dtype, gas, (pdf, prescale) in itertools.product(stage_knobs(stage), DTYPES,
                                                                                   GAS_VALUES,
                                                                                   scale_knobs(topo.world_size)):
                points.append(AuditPoint(stage, rs, cg, bucket, topo.sp, topo.dp, dtype, gas, pdf, prescale))
    return points


def quick_space(topos: Sequence[Topo]) -> list[AuditPoint]:
    """A covering subset of the full space, every factor level present; see ``quick_rule``."""
    return [p for p in full_space(topos) if quick_rule(p)]


def quick_rule(p: AuditPoint) -> bool:
    """Which full-space points the quick mode keeps.

    * Every reduce path once per topology with sp > 1 or dp > 1: each stage with every
      (reduce_scatter, contiguous_gradients, bucket) at fp32, gas 1, no predivide, postscale.
    * The numerics and accumulation axes on the reduce paths they can change: bf16 and gas 2
      together, for each stage's default path and ZeRO-3's mixed-bucket split, on every
      topology.
    * The scaling knobs where each stage reads them: predivide "world" (the postscale
      shortcut) and "3", and prescale, on the paths that honour them (ZeRO-0, ZeRO-1/2
      without reduce_scatter, ZeRO-3 without reduce_scatter) plus one rejected combination
      per rejecting stage.
    World size 1 (sp1dp1) keeps only the default path of each stage: nothing is reduced.
    """
    base = p.dtype == "fp32" and p.gas == 1 and p.predivide == "1" and not p.prescale
    default_path = p.stage == 0 or (p.reduce_scatter and p.contiguous_gradients and p.bucket == "fits")
    mixed_bucket = p.stage == 3 and not p.reduce_scatter and p.contiguous_gradients and p.bucket == "overflow"
    if p.world_size == 1:
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
    if honours and p.bucket in (None, "fits", "overflow") and (p.stage in (0, 3) or p.bucket == "fits"):
        return True
    rejected_probe = (p.stage in (2, 3) and p.reduce_scatter and p.contiguous_gradients and p.bucket == "fits"
                      and p.predivide == "world" and not p.prescale)
    return rejected_probe


def select(mode: str, topos: Sequence[Topo], stages: Iterable[int] | None = None, dtypes: Iterable[str] | None = None,
           gas: Iterable[int] | None = None, patterns: Iterable[str] | None = None) -> list[AuditPoint]:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not in {MODES}")
    points = quick_space(topos) if mode == "quick" else full_space(topos)
    stages, dtypes, gas = (set(x) if x else None for x in (stages, dtypes, gas))
    patterns = list(patterns or [])
    return [
        p for p in points if (stages is None or p.stage in stages) and (dtypes is None or p.dtype in dtypes) and (
            gas is None or p.gas in gas) and (not patterns or any(fnmatch.fnmatchcase(p.id, pat) for pat in patterns))
    ]


def group_by_topology(points: Iterable[AuditPoint]) -> dict[Topo, list[AuditPoint]]:
    """Points per (world, sp), topologies in ascending order, points in their given order."""
    groups: dict[Topo, list[AuditPoint]] = {}
    for p in points:
        groups.setdefault(p.topo, []).append(p)
    return dict(sorted(groups.items()))
