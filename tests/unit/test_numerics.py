"""The reduce-path benchmark's numerics helpers: ULPs, designed inputs, partitions, stats."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _reduce_path_ranks as num  # noqa: E402


@pytest.mark.parametrize(
    "dtype, value, ulp",
    [
        (torch.bfloat16, 1.0, 2.0**-7),
        (torch.bfloat16, 1.99, 2.0**-7),
        (torch.bfloat16, 2.0, 2.0**-6),
        (torch.bfloat16, -3.0, 2.0**-6),
        (torch.float16, 1.0, 2.0**-10),
        (torch.float16, 2.0**-20, 2.0**-24),  # subnormal range: fixed spacing
        (torch.float16, 0.0, 2.0**-24),
        (torch.float32, 1.0, 2.0**-23),
        (torch.float32, 0.0, 2.0**-149),
    ])
def test_ulp_of(dtype, value, ulp):
    assert num.ulp_of(torch.tensor([value], dtype=torch.float64), dtype).item() == ulp


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_rounding_is_within_half_an_ulp(dtype):
    ref = torch.randn(10_000, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    err = num.ulp_error(ref.to(dtype), ref.double(), dtype)
    assert float(err.max()) <= 0.5
    assert float(num.ulp_error(ref.to(dtype).double() + num.ulp_of(ref.double(), dtype), ref.double(),
                               dtype).min()) >= 0.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_exact_inputs_sum_and_halve_exactly(dtype):
    ranks = [num.rank_gradient("exact", 5000, r, 3, dtype) for r in range(16)]
    for g in ranks:
        assert torch.equal(g, g.to(dtype).double())  # representable
    total = torch.stack(ranks).sum(0)
    partial = torch.zeros(5000, dtype=dtype)
    for g in ranks:
        partial = partial + (g.to(dtype) / 4)
    assert torch.equal(partial.double(), total / 4)  # every partial sum and the division are exact
    thirds = sum(g.to(dtype) / 3 for g in ranks[:3]) * 3
    assert not torch.equal(thirds.double(), sum(ranks[:3]))  # a division by 3 is not


def test_inputs_differ_by_rank_and_param_but_are_reproducible():
    a = num.rank_gradient("random", 100, 0, 0, torch.bfloat16)
    assert torch.equal(a, num.rank_gradient("random", 100, 0, 0, torch.bfloat16))
    assert not torch.equal(a, num.rank_gradient("random", 100, 1, 0, torch.bfloat16))
    assert not torch.equal(a, num.rank_gradient("random", 100, 0, 1, torch.bfloat16))
    small = num.rank_gradient("small", 1000, 0, 0, torch.float16)
    assert float(small.abs().max()) < 2.0**-8
    with pytest.raises(ValueError):
        num.rank_gradient("nope", 1, 0, 0, torch.float32)


@pytest.mark.parametrize("numel, world, slices", [
    (5, 2, [(0, 3), (3, 5)]),
    (3, 4, [(0, 1), (1, 2), (2, 3), (3, 3)]),
    (8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
])
def test_partition_slice_matches_zero3_chunks(numel, world, slices):
    assert [num.partition_slice(numel, world, r) for r in range(world)] == slices


def test_error_stats_handle_zero_oracle_and_merge():
    ref = torch.tensor([1.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    val = torch.tensor([1.0 + 2.0**-7, 0.0, 2.0**-20, 2.0], dtype=torch.float64)
    a = num.ErrorStats()
    a.add(val, ref, torch.bfloat16)
    s = a.summary()
    assert s["max_ulp"] == 1.0 and s["mean_ulp"] == 0.5
    assert s["exact_fraction"] == 0.5 and s["correctly_rounded_fraction"] == 0.5
    assert (s["zero_oracle"], s["zero_oracle_missed"]) == (2, 1)
    b = num.ErrorStats()
    b.add(ref, ref, torch.bfloat16)
    a.merge(b)
    assert a.summary()["elements"] == 8 and a.summary()["exact_fraction"] == 6 / 8


def test_bitwise_equal_sees_signed_zero_and_length():
    z = [torch.tensor([0.0, 1.0])]
    assert num.bitwise_equal(z, [torch.tensor([0.0, 1.0])], torch.bfloat16)
    assert not num.bitwise_equal(z, [torch.tensor([-0.0, 1.0])], torch.bfloat16)
    assert not num.bitwise_equal(z, [torch.tensor([0.0])], torch.bfloat16)
