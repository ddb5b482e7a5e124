"""Sequence-/data-parallel layout (sp groups: blocks of consecutive ranks; dp groups: one rank from each block,
as in DeepSpeed's ``parallel_state_sp``), and the mpu object that hands it to DeepSpeed."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, order=True)  # order: by world size, then sp
class Topology:
    world_size: int
    sp: int

    @classmethod
    def create(cls, world_size: int, sp: int) -> Topology:
        if sp < 1 or world_size < 1:
            raise ValueError(f"world size ({world_size}) and sp ({sp}) must be >= 1")
        if world_size % sp:
            raise ValueError(f"world size {world_size} is not divisible by sp {sp}")
        return cls(world_size, sp)

    @property
    def dp(self) -> int:
        return self.world_size // self.sp

    def label(self) -> str:
        return f"sp{self.sp}dp{self.dp}"

    def sp_groups(self) -> list[list[int]]:
        return [list(range(i * self.sp, (i + 1) * self.sp)) for i in range(self.dp)]


class SequenceParallelMpu:
    """A minimal mpu for DeepSpeed versions without ``parallel_state_sp`` (before 0.17); its "data-parallel
    group" spans every sp x dp rank (docs/code/repro-harness-gradscale-audit.md says why)."""

    def __init__(self, topology: Topology):
        from deepspeed import comm as dist

        rank = dist.get_rank()
        self._dist, self._topology = dist, topology
        self._sp = _own_group(dist, topology.sp_groups(), rank)
        self._mp = _own_group(dist, [[r] for r in range(topology.world_size)], rank)
        self._sdp = dist.new_group(list(range(topology.world_size)))

    def get_sequence_parallel_group(self):
        return self._sp

    def get_sequence_parallel_world_size(self) -> int:
        return self._topology.sp

    def get_sequence_parallel_rank(self) -> int:
        return self._dist.get_rank(group=self._sp)

    def get_sequence_data_parallel_group(self):
        return self._sdp

    def get_sequence_data_parallel_world_size(self) -> int:
        return self._topology.world_size

    def get_sequence_data_parallel_rank(self) -> int:
        return self._dist.get_rank()

    # ZeRO's "data-parallel group" is the sequence+data-parallel one: every sp x dp rank.
    get_data_parallel_group = get_sequence_data_parallel_group
    get_data_parallel_world_size = get_sequence_data_parallel_world_size
    get_data_parallel_rank = get_sequence_data_parallel_rank

    def get_model_parallel_group(self):
        return self._mp

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def _own_group(dist, groups: list[list[int]], rank: int):
    created = [(dist.new_group(ranks), ranks) for ranks in groups]  # every group, on every rank, in order
    return next((group for group, ranks in created if rank in ranks), None)


def build_mpu(topology: Topology):
    """The mpu to pass to ``deepspeed.initialize``: None for sp == 1, else DeepSpeed's own ``parallel_state_sp``
    (0.17+; module globals, initialized once per process) where it has one."""
    if topology.sp == 1:
        return None
    try:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
    except ImportError:
        return SequenceParallelMpu(topology)
    try:
        parallel_state_sp.get_sequence_parallel_group()
    except AssertionError:
        parallel_state_sp.initialize_sequence_parallel(sequence_parallel_size=topology.sp)
    return parallel_state_sp
