"""Numerics helpers for benchmarks/reduce_path.py: designed inputs, the fp64 oracle, ULP errors.

Plain torch, no DeepSpeed, no process group (tests/unit/test_numerics.py). The ULP definition and the input
kinds: docs/code/benchmarks.md.
"""

from __future__ import annotations

import dataclasses

import torch

# dtype -> (explicit mantissa bits, smallest normal exponent)
FORMATS = {torch.float32: (23, -126), torch.bfloat16: (7, -126), torch.float16: (10, -14)}
BITS_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}

# Input kinds. "exact": per element an exponent shared by all ranks and a small integer per rank, so that every
# partial sum over <= 16 ranks is exact in bf16, fp16 and fp32 (as is a division by a power of two).
KINDS = ("exact", "random", "small")
_EXACT_MAX_INT = 15
_EXACT_EXPONENTS = range(-6, 3)


def ulp_of(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each element of ``reference`` (float64), exactly."""
    mantissa_bits, emin = FORMATS[dtype]
    ref = reference.double().abs()
    _, exponent = torch.frexp(ref)  # ref = m * 2**exponent, m in [0.5, 1): floor(log2 ref) = exponent - 1
    floor_log2 = torch.where(ref > 0, exponent.double() - 1, torch.full_like(ref, emin))
    return torch.exp2(floor_log2.clamp(min=emin) - mantissa_bits)


def ulp_error(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (value.double() - reference.double()).abs() / ulp_of(reference, dtype)


def rank_gradient(kind: str, numel: int, rank: int, param_index: int, dtype: torch.dtype,
                  seed: int = 8692) -> torch.Tensor:
    """Rank ``rank``'s local gradient of parameter ``param_index`` (float64, representable in dtype)."""
    if kind not in KINDS:
        raise ValueError(f"unknown input kind {kind!r}; one of {KINDS}")
    own = torch.Generator().manual_seed(seed * 1_000_003 + param_index * 1009 + rank)
    if kind == "exact":
        shared = torch.Generator().manual_seed(seed * 1_000_003 + param_index * 1009 + 999)  # same on every rank
        exps = torch.randint(min(_EXACT_EXPONENTS), max(_EXACT_EXPONENTS) + 1, (numel, ), generator=shared)
        ints = torch.randint(-_EXACT_MAX_INT, _EXACT_MAX_INT + 1, (numel, ), generator=own)
        values = ints.double() * torch.exp2(exps.double())
    else:
        values = torch.randn(numel, generator=own, dtype=torch.float64)
        if kind == "small":
            values = values * 2.0**-12
    return values.to(dtype).double()  # rounded to dtype and back: what a rank can hold in that format


def partition_slice(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of ``rank``'s ZeRO-3 partition of a ``numel``-element gradient (ceil chunks)."""
    chunk = -(-numel // world_size)
    start = min(rank * chunk, numel)
    return start, min(start + chunk, numel)


@dataclasses.dataclass
class ErrorStats:
    """ULP errors of one path against the oracle, summed over elements (mergeable across ranks).

    Where the oracle is 0 an element counts as exact when the path gives 0 too, else in ``zero_missed``;
    ``max_ulp``/``mean_ulp`` are over the elements whose oracle is not 0.
    """

    n: int = 0
    n_exact: int = 0  # equal to the oracle
    n_rounded: int = 0  # within 0.5 ULP: the oracle correctly rounded (0 where the oracle is 0)
    n_nonzero: int = 0
    n_zero_missed: int = 0  # oracle 0, path not
    max_ulp: float = 0.0
    sum_ulp: float = 0.0
    scale_samples: list = dataclasses.field(default_factory=list)  # median output / oracle, one per call

    def add(self, value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
        value, reference = value.double(), reference.double()
        zero = reference == 0
        err = ulp_error(value[~zero], reference[~zero], dtype)
        self.n += value.numel()
        self.n_exact += int((value == reference).sum())
        self.n_nonzero += err.numel()
        self.n_rounded += int((err <= 0.5).sum()) + int((value[zero] == 0).sum())
        self.n_zero_missed += int((value[zero] != 0).sum())
        if err.numel():
            self.max_ulp = max(self.max_ulp, float(err.max()))
            self.sum_ulp += float(err.sum())
            self.scale_samples.append(float((value[~zero] / reference[~zero]).median()))

    def merge(self, other: ErrorStats) -> None:
        for f in ("n", "n_exact", "n_rounded", "n_nonzero", "n_zero_missed", "sum_ulp"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.max_ulp = max(self.max_ulp, other.max_ulp)
        self.scale_samples.extend(other.scale_samples)

    def summary(self) -> dict:
        scales = sorted(self.scale_samples)
        return dict(elements=self.n, max_ulp=self.max_ulp,
                    mean_ulp=self.sum_ulp / self.n_nonzero if self.n_nonzero else 0.0,
                    exact_fraction=self.n_exact / self.n if self.n else 0.0,
                    correctly_rounded_fraction=self.n_rounded / self.n if self.n else 0.0,
                    zero_oracle=self.n - self.n_nonzero, zero_oracle_missed=self.n_zero_missed,
                    scale=scales[len(scales) // 2] if scales else None)


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor], dtype: torch.dtype) -> bool:
    """Same bits in ``dtype`` (the reduction's format: both outputs come from it, so the cast is exact)."""
    if len(a) != len(b):
        return False
    view = BITS_VIEW[dtype]
    return all(x.numel() == y.numel() and torch.equal(x.to(dtype).view(view),
                                                      y.to(dtype).view(view)) for x, y in zip(a, b))
