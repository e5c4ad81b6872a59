"""Gradient synchronisation across the replicas of each stage.

Replicas of a stage may shard a weight differently (TP 2 vs TP 4) and run
different numbers of samples. Because every microbatch's loss is already
divided by the global batch's token count (schedule.py), the synced gradient
is the plain sum over replicas. The sum is taken chunk by chunk (see
sharding.py): chunk c of a sharded weight is all-reduced among the ranks that
hold it, one per replica. A tensor every TP rank holds whole carries the same
gradient on each of its replica's tp ranks, so each copy is scaled by 1/tp
before the all-reduce over the whole stage: every replica contributes once
(tp is a power of two, so the scaling is exact).

The gradients are those of the fp32 main parameters (precision.py): the
model's own parameters in fp32 runs; with bf16/fp16 the fp32 main gradients
that every microbatch's low-precision gradient is added into, so the
all-reduce sums fp32 values whatever the compute dtype.

Chunks that share an owner set are flattened into buckets of at most
`bucket_numel` elements, one all-reduce per bucket. Ranks run their buckets in
one global order (by owner set), so no two ranks wait on each other in
opposite orders.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_ext.sharding import Chunk, ParamShard, chunks_of
from sailor_ext.topology import RankSet, Topology

DEFAULT_BUCKET_NUMEL = 2**25  # 128 MiB of fp32


@dataclass
class Bucket:
    owners: RankSet
    items: list[tuple[torch.Tensor, Chunk, float]]  # (param, chunk, scale)
    numel: int
    flat: torch.Tensor | None = None
    # True when every item is a whole local parameter: their .grad are views
    # into `flat`, so the all-reduce runs in place with no copies.
    holds_grads: bool = False


class GradSync:
    """Owns the gradients of one rank's (main) parameters and sums them over replicas."""

    def __init__(self, params: dict[str, torch.Tensor], shards: dict[str, ParamShard], topology: Topology,
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL):
        self.topology = topology
        self.params = list(params.values())
        by_owners: dict[RankSet, list[tuple[torch.Tensor, Chunk, float]]] = {}
        for chunk in chunks_of(shards, topology):
            if len(chunk.owners) == 1:
                continue  # nobody else holds it
            scale = 1.0 / chunk.shard.tp if chunk.shard.dim is None else 1.0
            by_owners.setdefault(chunk.owners, []).append((params[chunk.param_name], chunk, scale))
        self.buckets: list[Bucket] = []
        for owners in sorted(by_owners):
            current: list = []
            size = 0
            for item in by_owners[owners]:
                n = item[1].shard.chunk_view(item[0], item[1].chunk).numel()
                if current and size + n > bucket_numel:
                    self.buckets.append(self._bucket(owners, current, size))
                    current, size = [], 0
                current.append(item)
                size += n
            if current:
                self.buckets.append(self._bucket(owners, current, size))
        self._viewed = {id(p) for b in self.buckets if b.holds_grads for p, _, _ in b.items}
        self.zero_grad()

    @staticmethod
    def _bucket(owners: RankSet, items: list, numel: int) -> Bucket:
        device = items[0][0].device
        whole = all(param.numel() == chunk.shard.chunk_view(param, chunk.chunk).numel() for param, chunk, _ in items)
        unique = len({id(param) for param, _, _ in items}) == len(items)
        bucket = Bucket(owners, items, numel, torch.zeros(numel, dtype=torch.float32, device=device),
                        holds_grads=whole and unique and all(p.dtype == torch.float32 for p, _, _ in items))
        if bucket.holds_grads:
            offset = 0
            for param, _, _ in items:
                param.grad = bucket.flat[offset: offset + param.numel()].view_as(param)
                offset += param.numel()
        return bucket

    def zero_grad(self) -> None:
        """Zero the bucket-held gradients in place; drop the others."""
        for bucket in self.buckets:
            if bucket.holds_grads:
                bucket.flat.zero_()
        for param in self.params:
            if id(param) not in self._viewed:
                param.grad = None

    @torch.no_grad()
    def sync(self) -> None:
        """Replace every local gradient by its sum over the replicas of its stage."""
        for bucket in self.buckets:
            flat = bucket.flat
            offset = 0
            views = []
            for param, chunk, scale in bucket.items:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                view = chunk.shard.chunk_view(param.grad, chunk.chunk)
                segment = flat[offset: offset + view.numel()].view(view.shape)
                if not bucket.holds_grads:
                    segment.copy_(view)
                    views.append((view, segment))
                if scale != 1.0:
                    segment.mul_(scale)
                offset += view.numel()
            dist.all_reduce(flat, group=self.topology.group(bucket.owners))
            for view, segment in views:
                view.copy_(segment)

    @property
    def num_collectives(self) -> int:
        return len(self.buckets)
