"""What the gradient-scale reproducers measure: the ZeRO configurations and the probe's parameters.

Plain data, no torch and no DeepSpeed: a script picks its configurations and parameter shapes
from here, ``measure`` runs them.
"""

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
        knobs = [
            f"rs={self.reduce_scatter}" if self.reduce_scatter is not None else "",
            f"cg={self.contiguous_gradients}" if self.contiguous_gradients is not None else "",
            f"bucket={self.reduce_bucket_size}" if self.reduce_bucket_size is not None else ""
        ]
        return " ".join([f"zero{self.stage}"] + [k for k in knobs if k])

    def zero_section(self) -> dict[str, Any]:
        section: dict[str, Any] = {"stage": self.stage}
        for key in ("reduce_scatter", "contiguous_gradients", "reduce_bucket_size"):
            if getattr(self, key) is not None:
                section[key] = getattr(self, key)
        return section


# The four ZeRO-3 configurations (reduce_scatter, contiguous_gradients, bucket):
# (False, True, 500) takes the contiguous path; (False, False, 500) and (True, True, 500)
# take __avg_scatter_grads; (False, True, 16) splits: small params contiguous, large not.
ZERO3_CONFIGS = (
    ZeroConfig(3, False, True, 500),
    ZeroConfig(3, False, False, 500),
    ZeroConfig(3, True, True, 500),
    ZeroConfig(3, False, True, 16),
)
REFERENCE_CONFIGS = (ZeroConfig(1), ZeroConfig(2))


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int


# The issue report's shape: a parameter that fits a small reduce bucket and one that does not.
SMALL_AND_LARGE = (ParamSpec("small", 4), ParamSpec("large", 64))
