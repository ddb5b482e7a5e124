"""What the gradient-scale reproducers measure: the ZeRO configurations and the probe's parameters. Plain data."""

from __future__ import annotations

import dataclasses
from typing import Any

SCRIPTS = ("zero3_sp_grad_scale", "zero3_sp_mixed_bucket")  # the family's programs, repro/<name>.py


@dataclasses.dataclass(frozen=True)
class ZeroConfig:
    stage: int
    reduce_scatter: bool | None = None
    contiguous_gradients: bool | None = None
    reduce_bucket_size: int | None = None

    def label(self) -> str:
        knobs = {"rs": self.reduce_scatter, "cg": self.contiguous_gradients, "bucket": self.reduce_bucket_size}
        return " ".join([f"zero{self.stage}"] + [f"{k}={v}" for k, v in knobs.items() if v is not None])

    def zero_section(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


# The four ZeRO-3 configurations (reduce_scatter, contiguous_gradients, bucket):
# (False, True, 500) takes the contiguous path; (False, False, 500) and (True, True, 500)
# take __avg_scatter_grads; (False, True, 16) splits: small params contiguous, large not.
ZERO3_CONFIGS = tuple(
    ZeroConfig(3, *k) for k in ((False, True, 500), (False, False, 500), (True, True, 500), (False, True, 16)))
REFERENCE_CONFIGS = (ZeroConfig(1), ZeroConfig(2))


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int


# The issue report's shape: a parameter that fits a small reduce bucket and one that does not.
SMALL_AND_LARGE = (ParamSpec("small", 4), ParamSpec("large", 64))
