import pytest
import torch

from repro.gradscale.run import matches
from repro.harness.engine import zero3_path
from repro.harness.scales import ReducePath, expected_scale, fit, label


@pytest.mark.parametrize(
    "path,sp,expect,scale",
    [
        (ReducePath.AVG_SCATTER, 2, "buggy", 0.5),
        (ReducePath.AVG_SCATTER, 4, "buggy", 0.25),
        (ReducePath.AVG_SCATTER, 1, "buggy", 1.0),  # no sp, no bug
        (ReducePath.CONTIGUOUS, 2, "buggy", 1.0),
        (ReducePath.STAGE_1_2, 4, "buggy", 1.0),
        (ReducePath.AVG_SCATTER, 2, "fixed", 1.0),
        (ReducePath.CONTIGUOUS, 2, "fixed", 1.0),
    ])
def test_expected_scale(path, sp, expect, scale):
    assert expected_scale(path, sp, expect) == scale


def test_unknown_expectation():
    with pytest.raises(ValueError):
        expected_scale(ReducePath.AVG_SCATTER, 2, "maybe")


def test_fit_finds_the_scale_and_no_residual():
    e = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    c = fit(0.5 * e, e)
    assert c.ratio == pytest.approx(0.5) and c.residual == pytest.approx(0.0, abs=1e-12)


def test_fit_sees_a_direction_change():
    e = torch.tensor([1.0, 0.0])
    c = fit(torch.tensor([0.0, 1.0]), e)
    assert c.ratio == pytest.approx(0.0) and c.residual == pytest.approx(1.0)


def test_fit_rejects_zero_expectation():
    with pytest.raises(ValueError):
        fit(torch.ones(2), torch.zeros(2))


def test_matches_is_elementwise():
    e = torch.tensor([1.0, 2.0])
    assert matches(torch.tensor([0.5, 1.0]), e, 0.5)
    assert not matches(torch.tensor([0.5, 1.0]), e, 1.0)
    assert not matches(torch.tensor([0.5, 1.01]), e, 0.5)


@pytest.mark.parametrize("ratio,residual,name", [(1.0, 0.0, "1"), (0.5, 0.0, "1/2"), (0.25, 0.0, "1/4"),
                                                 (2.0, 0.0, "2"), (1.0, 0.1, "other"), (0.0, 1.0, "other"),
                                                 (-0.5, 0.0, "other")])
def test_label(ratio, residual, name):
    assert label(ratio, residual) == name


def test_bug_scales_only_avg_scatter_with_sp():
    from repro.harness.scales import bug_scales

    assert bug_scales(ReducePath.AVG_SCATTER, 2) and bug_scales("__avg_scatter_grads", 4)
    assert not bug_scales(ReducePath.AVG_SCATTER, 1)
    assert not any(bug_scales(p, 2) for p in (ReducePath.CONTIGUOUS, ReducePath.STAGE_1_2, ReducePath.STAGE_0))


def test_zero3_path_refuses_an_unwatched_gradient():
    seen, unseen = torch.zeros(1), torch.zeros(1)
    paths = {id(seen): ReducePath.CONTIGUOUS}
    assert zero3_path(paths, seen) is ReducePath.CONTIGUOUS
    with pytest.raises(RuntimeError, match="^a gradient went through neither ZeRO-3 reduce path$"):
        zero3_path(paths, unseen)
    with pytest.raises(RuntimeError, match="^z3: the gradient of a parameter went through neither ZeRO-3 reduce"):
        zero3_path(paths, unseen, "z3: ", "the gradient of a parameter")
