import pytest
import torch

from repro.verdict import ReducePath, classify, compare, matches, target_scale


@pytest.mark.parametrize("path,sp,expect,scale", [
    (ReducePath.AVG_SCATTER, 2, "buggy", 0.5),
    (ReducePath.AVG_SCATTER, 4, "buggy", 0.25),
    (ReducePath.AVG_SCATTER, 1, "buggy", 1.0),  # no sp, no bug
    (ReducePath.CONTIGUOUS, 2, "buggy", 1.0),
    (ReducePath.STAGE_1_2, 4, "buggy", 1.0),
    (ReducePath.AVG_SCATTER, 2, "fixed", 1.0),
    (ReducePath.CONTIGUOUS, 2, "fixed", 1.0),
])
def test_target_scale(path, sp, expect, scale):
    assert target_scale(path, sp, expect) == scale


def test_unknown_expectation():
    with pytest.raises(ValueError):
        target_scale(ReducePath.AVG_SCATTER, 2, "maybe")


def test_compare_finds_the_scale_and_no_residual():
    e = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    c = compare(0.5 * e, e)
    assert c.ratio == pytest.approx(0.5) and c.residual == pytest.approx(0.0, abs=1e-12)


def test_compare_sees_a_direction_change():
    e = torch.tensor([1.0, 0.0])
    c = compare(torch.tensor([0.0, 1.0]), e)
    assert c.ratio == pytest.approx(0.0) and c.residual == pytest.approx(1.0)


def test_compare_rejects_zero_expectation():
    with pytest.raises(ValueError):
        compare(torch.ones(2), torch.zeros(2))


def test_matches_is_elementwise():
    e = torch.tensor([1.0, 2.0])
    assert matches(torch.tensor([0.5, 1.0]), e, 0.5)
    assert not matches(torch.tensor([0.5, 1.0]), e, 1.0)
    assert not matches(torch.tensor([0.5, 1.01]), e, 0.5)


@pytest.mark.parametrize("ratio,residual,label", [
    (1.0, 0.0, "1.0"), (0.5, 0.0, "1/2"), (2.0, 0.0, "2"), (0.7, 0.0, "other"), (1.0, 0.1, "other")])
def test_classify(ratio, residual, label):
    assert classify(ratio, residual, sp=2) == label
