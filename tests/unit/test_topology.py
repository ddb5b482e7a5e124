import pytest

from repro.harness.topology import Topology


def test_groups_sp2_dp2():
    t = Topology.create(4, 2)
    assert t.dp == 2
    assert t.sp_groups() == [[0, 1], [2, 3]]
    assert t.dp_groups() == [[0, 2], [1, 3]]


def test_groups_sp4():
    t = Topology.create(4, 4)
    assert t.sp_groups() == [[0, 1, 2, 3]] and t.dp_groups() == [[0], [1], [2], [3]]


@pytest.mark.parametrize("world,sp", [(3, 2), (2, 0), (0, 1), (4, -2)])
def test_bad_topologies(world, sp):
    with pytest.raises(ValueError):
        Topology.create(world, sp)
