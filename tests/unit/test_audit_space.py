import collections

import pytest

from repro.audit.space import (AuditPoint, DTYPES, GAS_VALUES, PREDIVIDE_LEVELS, STAGES, full_space, group_by_topology,
                               select, topologies)
from repro.harness.topology import Topology

ALL = topologies()


def test_topologies_are_sp_by_dp_up_to_four_ranks():
    assert [(t.world_size, t.sp, t.dp) for t in ALL] == [(1, 1, 1), (2, 1, 2), (2, 2, 1), (4, 2, 2), (4, 4, 1)]
    assert topologies([4]) == [Topology(4, 2), Topology(4, 4)]
    assert topologies(None, [2]) == [Topology(2, 2), Topology(4, 2)]
    assert topologies([3]) == []


def test_full_space_size_and_uniqueness():
    points = full_space(ALL)
    # per topology: 25 (stage, knob) combos x 2 dtypes x 2 gas x 6 scaling combos (4 at world 1)
    assert len(points) == 25 * 2 * 2 * 4 + 4 * 25 * 2 * 2 * 6
    assert len({p.id for p in points}) == len(points)


def test_stage0_takes_no_knobs_and_others_need_them():
    assert {(p.reduce_scatter, p.contiguous_gradients, p.bucket)
            for p in full_space(ALL) if p.stage == 0} == {(None, None, None)}
    with pytest.raises(ValueError):
        AuditPoint(0, True, None, None, 2, 1)
    with pytest.raises(ValueError):
        AuditPoint(3, True, True, None, 2, 1)
    with pytest.raises(ValueError):
        AuditPoint(3, True, True, "huge", 2, 1)


def test_world_one_has_no_world_factor_level():
    assert not [p for p in full_space([Topology(1, 1)]) if p.predivide == "world"]


def test_point_config():
    p = AuditPoint(3, False, True, "overflow", 2, 2, "bf16", 2, "world", False)
    assert p.world == 4 and p.predivide_factor == 4.0 and p.reduce_bucket_size == 16
    assert p.id == "z3.rs0.cg1.overflow/sp2dp2/bf16/gas2/pdf=world/postscale"
    assert p.zero_section() == {
        "stage": 3,
        "reduce_scatter": False,
        "contiguous_gradients": True,
        "reduce_bucket_size": 16
    }
    assert AuditPoint(0, None, None, None, 1, 2).zero_section() == {"stage": 0}
    assert p.config_overrides() == {
        "gradient_accumulation_steps": 2,
        "gradient_predivide_factor": 4.0,
        "prescale_gradients": False,
        "bf16": {
            "enabled": True
        }
    }
    assert AuditPoint(0, None, None, None, 1, 2, predivide="3", prescale=True).config_overrides() == {
        "gradient_accumulation_steps": 1,
        "gradient_predivide_factor": 3.0,
        "prescale_gradients": True
    }
    assert AuditPoint.model_validate(p.model_dump()) == p


def test_quick_is_a_subset_covering_every_level():
    full, quick = full_space(ALL), select("quick", ALL)
    assert set(quick) <= set(full) and len(quick) < len(full) / 5
    assert {p.stage for p in quick} == set(STAGES)
    assert {p.dtype for p in quick} == set(DTYPES) and {p.gas for p in quick} == set(GAS_VALUES)
    assert {p.predivide for p in quick} == set(PREDIVIDE_LEVELS) and {p.prescale for p in quick} == {False, True}
    assert {p.topo for p in quick} == set(ALL)
    # every (stage, reduce_scatter, contiguous_gradients, bucket) on every topology with more than one rank
    for topo in ALL[1:]:
        knobs = {(p.stage, p.reduce_scatter, p.contiguous_gradients, p.bucket) for p in quick if p.topo == topo}
        assert len(knobs) == 25
    # the scatter path under sp with a predivide factor (where two upstream bugs compose)
    assert any(
        p.stage == 3 and not p.reduce_scatter and not p.contiguous_gradients and p.predivide == "world" and p.sp > 1
        for p in quick)


def test_select_filters():
    pts = select("full", ALL, stages=[3], dtypes=["bf16"], gas=[2], patterns=["*/sp2dp1/*"])
    assert pts and all(p.stage == 3 and p.dtype == "bf16" and p.gas == 2 and p.topo == Topology(2, 2) for p in pts)
    assert select("quick", ALL, patterns=["nothing"]) == []
    with pytest.raises(ValueError):
        select("medium", ALL)


def test_group_by_topology_orders_launches_and_keeps_point_order():
    pts = select("full", ALL, stages=[0])
    groups = group_by_topology(reversed(pts))
    assert list(groups) == ALL
    assert sum(len(v) for v in groups.values()) == len(pts)
    for topo, members in groups.items():
        assert all(p.topo == topo for p in members)
        assert members == [p for p in reversed(pts) if p.topo == topo]
    assert collections.Counter(p.topo for p in pts) == {t: len(v) for t, v in groups.items()}
