"""Gradient buckets (sailor_ext/grad_sync.py): every rank starts its all-reduces in one global order.

No processes: the bucket plan of every rank of a heterogeneous, tied plan is
computed from its layout alone, and checked for what deadlock freedom needs:
the members of a group build the same buckets, and all ranks' launch orders
are parts of one total order, with the tied embedding's buckets last.
"""
from __future__ import annotations

import datetime
from graphlib import TopologicalSorter

from _runtime_helpers import plan_dict

from planner.launch import rank_layout
from planner.specs.plan import plan_from_dict
from sailor_ext.grad_sync import bucket_items, plan_buckets
from sailor_ext.sharding import ParamShard
from sailor_ext.topology import Topology


def topology_of(layout, rank: int) -> Topology:
    """A Topology that answers who holds what, without process groups."""
    topo = object.__new__(Topology)
    topo.layout, topo.rank, topo.tied_embeddings, topo.timeout = layout, rank, True, datetime.timedelta(1)
    return topo


def shards_of(topo: Topology) -> dict[str, ParamShard]:
    """A stage's parameters as StageModel registers them: per layer a column-parallel weight, a
    row-parallel weight and a norm; the word embedding on the first and the last stage (tied)."""
    slot, stage = topo.slot, topo.layout.plan.stages[topo.stage]
    chunks = topo.stage_tp(topo.stage)
    tied = topo.tied_stages()
    word_chunks = max(topo.stage_tp(s) for s in tied)
    out = {}
    for layer in range(stage.first, stage.last + 1):
        if layer == 0:
            out["0.word"] = ParamShard("word", (64, 8), 0, slot.tp, slot.tp_rank, word_chunks, tied)
            continue
        if topo.is_last_stage and layer == stage.last:
            out[f"{layer}.out"] = ParamShard("word", (64, 8), 0, slot.tp, slot.tp_rank, word_chunks, tied)
            continue
        for name, shape, dim in (("col", (16, 8), 0), ("row", (8, 16), 1), ("norm", (8,), None)):
            out[f"{layer}.{name}"] = ParamShard(f"{layer}.{name}", shape, dim, slot.tp, slot.tp_rank,
                                                chunks if dim is not None else 1, (topo.stage,))
    return out


def test_every_rank_starts_its_buckets_in_one_global_order():
    plan = plan_from_dict(plan_dict([((0, 2), [4, 2]), ((3, 4), [1, 2]), ((5, 7), [2, 1])], [(2, 4), (1, 4)]))
    layout = rank_layout(plan)
    orders = {}
    for rank in range(layout.world_size):
        topo = topology_of(layout, rank)
        # 40 elements: a few chunks per bucket, so owner sets span several buckets
        buckets = plan_buckets(bucket_items(shards_of(topo), topo), bucket_numel=40)
        orders[rank] = [(b[0].chunk.owners, tuple((it.chunk.shard.name, it.chunk.chunk) for it in b))
                        for b in buckets]
        assert all(rank in owners for owners, _ in orders[rank])
        tied = [("word" in {n for n, _ in items}) for _, items in orders[rank]]
        assert tied == sorted(tied), f"rank {rank}: the tied embedding's buckets go last"
    # the members of each group build the same buckets, in the same order
    groups: dict = {}
    for rank, order in orders.items():
        for owners, items in order:
            groups.setdefault(owners, {}).setdefault(rank, []).append(items)
    assert len(groups) > 5
    for owners, by_rank in groups.items():
        assert set(by_rank) == set(owners)
        assert len({tuple(seq) for seq in by_rank.values()}) == 1, owners
    # one total order: the union of every rank's "started before" is acyclic
    graph: dict = {}
    for order in orders.values():
        for before, after in zip(order, order[1:]):
            graph.setdefault(after, set()).add(before)
    list(TopologicalSorter(graph).static_order())  # raises CycleError otherwise
    # a bucket starts when the backward pass has finished its last chunk's gradient: last layer first
    last = [int(items[-1][0].split(".")[0]) for _, items in orders[0] if items[-1][0] != "word"]
    assert last == sorted(last, reverse=True) and len(set(last)) > 1
