"""Which stage, replica and TP rank this process is, and its process groups.

The rank layout comes from `planner.launch.rank_layout`, so every rank, the
launcher and the simulator agree on it. Groups:

  * a TP group per (stage, replica); its size may differ between stages and
    between the replicas of one stage;
  * gradient-sync groups per stage: replicas of a stage may shard a weight
    differently (TP 2 vs TP 4), so each sharded weight is cut into the finest
    common chunking (the stage's largest TP degree) and chunk c is reduced
    among the ranks that hold it, one per replica. Tensors that every TP rank
    holds whole (norms, row-parallel biases) are reduced among all ranks of
    the stage. With tied embeddings the word embedding is held by the first
    and the last stage, and its chunks are reduced across both.

`torch.distributed.new_group` must be called by every rank, in the same order,
for every group; we create all groups of the plan up front, in a fixed order.
Point-to-point traffic between stages uses the default group.

The process group may hold more ranks than the plan: in an elastic job,
workers outside the plan join as donors of their in-memory state
(elastic/reshard.py). A donor builds a Topology too (so that it creates the
same groups) but holds no slot; the plan's own world-wide collectives run on
`world_group`.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from planner.launch import Layout, RankSlot

RankSet = tuple[int, ...]


@dataclass
class Topology:
    layout: Layout
    rank: int
    device: torch.device
    tied_embeddings: bool = False
    timeout: datetime.timedelta | None = None
    groups: dict[RankSet, dist.ProcessGroup] = field(default_factory=dict, repr=False)
    # the plan's ranks, when the process group also holds donors (None: the default group)
    world_group: dist.ProcessGroup | None = field(default=None, repr=False)

    def __post_init__(self):
        for ranks in self.required_rank_sets():
            group = dist.new_group(list(ranks), timeout=self.timeout)
            if self.rank in ranks:
                self.groups[ranks] = group
        if dist.get_world_size() != self.layout.world_size:
            self.world_group = dist.new_group(list(range(self.layout.world_size)), timeout=self.timeout)
        # A first collective over the world before any point-to-point batch
        # (NCCL requires it; for gloo it checks that every rank arrived).
        dist.barrier()

    # -- who am I --------------------------------------------------------------
    @property
    def in_plan(self) -> bool:
        return self.rank < self.layout.world_size

    @property
    def slot(self) -> RankSlot:
        return self.layout.slots[self.rank]

    @property
    def stage(self) -> int:
        return self.slot.stage

    @property
    def replica(self) -> int:
        return self.slot.replica

    @property
    def tp_rank(self) -> int:
        return self.slot.tp_rank

    @property
    def tp(self) -> int:
        return self.slot.tp

    @property
    def num_stages(self) -> int:
        return self.layout.plan.pp

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def tp_group(self) -> dist.ProcessGroup:
        return self.groups[self.layout.tp_group(self.stage, self.replica)]

    @property
    def max_tp(self) -> int:
        """Largest TP degree in the plan: the vocabulary is padded for it."""
        return max(r.tp for s in self.layout.plan.stages for r in s.replicas)

    def group(self, ranks: RankSet) -> dist.ProcessGroup:
        return self.groups[ranks]

    # -- who holds what --------------------------------------------------------
    def stage_tp(self, stage: int) -> int:
        """The finest common chunking of a stage's sharded weights."""
        return max(r.tp for r in self.layout.plan.stages[stage].replicas)

    def chunk_owners(self, stages: tuple[int, ...], chunk: int, num_chunks: int) -> RankSet:
        """Ranks holding chunk `chunk` of `num_chunks` of a weight sharded over TP."""
        owners = set()
        for s in stages:
            for k, r in enumerate(self.layout.plan.stages[s].replicas):
                owners.add(self.layout.rank(s, k, chunk * r.tp // num_chunks))
        return tuple(sorted(owners))

    def whole_owners(self, stages: tuple[int, ...]) -> RankSet:
        """Ranks holding a tensor that every TP rank keeps whole."""
        return tuple(sorted(r for s in stages for r in self.layout.stage_ranks(s)))

    def tied_stages(self) -> tuple[int, ...]:
        """Stages that hold the word embedding when the head reuses it."""
        return tuple(sorted({0, self.num_stages - 1}))

    def required_rank_sets(self) -> list[RankSet]:
        """Every group of the plan, in creation order."""
        plan, sets, tp_groups = self.layout.plan, set(), set()
        for s in range(plan.pp):
            for k in range(plan.dp):
                tp_groups.add(self.layout.tp_group(s, k))
            sets.add(self.whole_owners((s,)))
            n = self.stage_tp(s)
            sets.update(self.chunk_owners((s,), c, n) for c in range(n))
        if self.tied_embeddings and plan.pp > 1:
            stages = self.tied_stages()
            n = max(self.stage_tp(s) for s in stages)
            sets.update(self.chunk_owners(stages, c, n) for c in range(n))
        # TP groups of one rank are created too: megatron's layers ask their
        # group for .size() and .rank().
        return sorted(tp_groups | {r for r in sets if len(r) > 1})
