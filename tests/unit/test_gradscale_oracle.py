import pytest
import torch

from repro.gradscale.model import expected_gradient, expected_gradients, local_gradients
from repro.gradscale.space import SMALL_AND_LARGE
from repro.harness.topology import Topology


def test_sums_over_sp_and_averages_over_dp():
    # ranks 0,1 form sp group 0 and ranks 2,3 sp group 1 (dp=2)
    local = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([10.0]), torch.tensor([20.0])]
    got = expected_gradient(local, Topology.create(4, 2))
    assert got.item() == pytest.approx(((1 + 2) + (10 + 20)) / 2)


def test_pure_data_parallel_is_the_mean():
    local = [torch.tensor([1.0, 3.0]), torch.tensor([3.0, 5.0])]
    assert torch.equal(expected_gradient(local, Topology.create(2, 1)), torch.tensor([2.0, 4.0]))


def test_pure_sequence_parallel_is_the_sum():
    local = [torch.tensor([float(r)]) for r in range(4)]
    assert expected_gradient(local, Topology.create(4, 4)).item() == 6.0


def test_wrong_number_of_ranks_is_an_error():
    with pytest.raises(ValueError):
        expected_gradient([torch.zeros(1)], Topology.create(2, 2))


def test_ranks_inputs_differ_so_a_missing_reduction_cannot_pass_for_a_scale():
    g0, g1 = (local_gradients(SMALL_AND_LARGE, r)["large"] for r in (0, 1))
    # not parallel: no scalar maps one rank's local gradient onto the reduced one
    cos = torch.nn.functional.cosine_similarity(g0, g1, dim=0)
    assert cos < 0.99


def test_expected_gradients_is_deterministic_and_float64():
    a = expected_gradients(SMALL_AND_LARGE, Topology.create(2, 2))
    b = expected_gradients(SMALL_AND_LARGE, Topology.create(2, 2))
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == torch.float64 for k in a)
