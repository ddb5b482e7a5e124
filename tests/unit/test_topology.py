import pytest

from repro.harness.topology import Topology


def test_groups_sp2_dp2():
    t = Topology.create(4, 2)
    assert t.dp == 2
    assert t.sp_groups() == [[0, 1], [2, 3]]


def test_groups_sp4():
    t = Topology.create(4, 4)
    assert t.sp_groups() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("world,sp", [(3, 2), (2, 0), (0, 1), (4, -2)])
def test_bad_topologies(world, sp):
    with pytest.raises(ValueError):
        Topology.create(world, sp)


def test_mpu_answers_zero_with_the_groups_of_the_layout(monkeypatch):
    """What DeepSpeed < 0.17 asks the mpu, for rank 3 of sp=2 x dp=2 (a stand-in deepspeed.comm)."""
    import sys
    import types

    from repro.harness.topology import SequenceParallelMpu

    created = []

    def new_group(ranks):
        created.append(tuple(ranks))
        return tuple(ranks)

    def get_rank(group=None):
        return 3 if group is None else group.index(3)

    comm = types.SimpleNamespace(new_group=new_group, get_rank=get_rank)
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(comm=comm))
    mpu = SequenceParallelMpu(Topology.create(4, 2))
    # Every rank creates every group, in the same order.
    assert created == [(0, 1), (2, 3), (0, ), (1, ), (2, ), (3, ), (0, 1, 2, 3)]
    assert (mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_world_size(),
            mpu.get_sequence_parallel_rank()) == ((2, 3), 2, 1)
    # ZeRO shards over every sp x dp rank: the data-parallel group is the sequence+data-parallel one.
    sdp = (mpu.get_sequence_data_parallel_group(), mpu.get_sequence_data_parallel_world_size(),
           mpu.get_sequence_data_parallel_rank())
    assert sdp == ((0, 1, 2, 3), 4, 3)
    assert (mpu.get_data_parallel_group(), mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()) == sdp
    assert (mpu.get_model_parallel_group(), mpu.get_model_parallel_world_size(),
            mpu.get_model_parallel_rank()) == ((3, ), 1, 0)
