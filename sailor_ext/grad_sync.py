"""Gradient synchronisation across the replicas of each stage, overlapped with the backward pass.

Replicas of a stage may shard a weight differently (TP 2 vs TP 4) and run
different numbers of samples. Because every microbatch's loss is already
divided by the global batch's token count (schedule.py), the synced gradient
is the plain sum over replicas. The sum is taken chunk by chunk (see
sharding.py): chunk c of a sharded weight is all-reduced among the ranks that
hold it, one per replica. A tensor every TP rank holds whole carries the same
gradient on each of its replica's tp ranks, so each copy is scaled by 1/tp
before the all-reduce over the whole stage: every replica contributes once
(tp is a power of two, so the scaling is exact). The per-head q/k norms of
Qwen3 are held whole but each TP rank's gradient covers only its own heads
(ParamShard.partial_grad): those copies are summed unscaled, which adds the
TP ranks' parts and then the replicas.

The gradients are those of the fp32 main parameters (precision.py): the
model's own parameters in fp32 runs; with bf16/fp16 the fp32 main gradients
that every microbatch's low-precision gradient is added into, so the
all-reduce sums fp32 values whatever the compute dtype.

Buckets. Chunks with the same owner set are flattened into buckets of at
most `bucket_numel` elements, in backward order: the stage's parameters in
reverse registration order (last layer first, as torch's DDP orders them),
so a bucket fills in the order the backward pass finishes its gradients.
Where a bucket holds a whole parameter its `.grad` is a view into the
bucket and the all-reduce runs in place; chunks of a parameter split over
several owner sets are copied in and out.

Overlap (--overlap-grad-reduce). A gradient is final when the last
microbatch's backward has added into it: a post-accumulate-grad hook counts
the microbatches each parameter has seen, and a bucket whose parameters all
reached this pipeline's microbatch count starts its all-reduce at once
(async_op=True) while the backward pass goes on; `finish` starts whatever is
left and waits for all of them before the caller reads a gradient (global
norm, optimizer). With activation recomputation (non-reentrant checkpoint) a
parameter still receives one accumulation per microbatch. Without overlap
`finish` starts every bucket after the schedule, the runtime's old behaviour.

Sharded (--use-distributed-optimizer). Each bucket's buffer is padded to a
multiple of its owner count d and reduce-scattered instead of all-reduced:
owner r (its rank in the bucket's group) receives the sum of elements
[r*n/d, (r+1)*n/d), the part of the bucket whose optimizer state it keeps
(distributed_optimizer.py). The other elements of the buffer then hold
partial sums that nobody reads; the same bytes cross the wire as with an
all-reduce once the optimizer has all-gathered the updated weights.

Deadlock freedom. Every rank starts its buckets in one order: by the key of
the bucket's last chunk, (position of its parameter in backward order,
chunk), which every holder of that chunk computes alike, because all replicas
of a stage have the same modules (TP changes only shapes); a bucket that
becomes ready before an earlier one waits for it. Restricted to any group,
that order is the same on all its members (they build the same buckets from
the same chunks), and over all groups it is one total order: the stage's
buckets by key, then the tied word embedding's (below), so no two ranks
wait on each other in opposite orders (NCCL's rule for several
communicators). The ranks of different stages share no group but the tied
embedding's, and those buckets always go last: on the first stage the
embedding's gradient is the last one anyway, and the last stage, whose
output layer finishes first, starts them in `finish`, since their sum needs
the first stage's gradient, which is ready only when the whole pipeline has
drained.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from sailor_ext.sharding import Chunk, ParamShard, chunks_of
from sailor_ext.topology import RankSet, Topology

DEFAULT_BUCKET_NUMEL = 2**22  # 16 MiB of fp32, about torch DDP's 25 MB default


@dataclass(frozen=True)
class Item:
    """One chunk of one local parameter, as a bucket holds it."""

    name: str  # local (main) parameter name
    chunk: Chunk
    scale: float  # 1/tp for a tensor every TP rank holds whole (and whose gradient each has whole), else 1
    key: tuple[int, int]  # (parameter's position in backward order, chunk): alike on every holder
    numel: int

    @property
    def tied(self) -> bool:
        return len(self.chunk.shard.stages) > 1


def bucket_items(shards: dict[str, ParamShard], topology: Topology) -> list[Item]:
    """The chunks this rank reduces with others (a chunk nobody else holds stays as it is).

    Backward order is the reverse of `shards`' order, the model's registration order, which every
    rank of a stage shares."""
    position = {name: i for i, name in enumerate(reversed(list(shards)))}
    return [Item(ch.param_name, ch, 1.0 / ch.shard.tp if ch.shard.dim is None and not ch.shard.partial_grad else 1.0,
                 (position[ch.param_name], ch.chunk), math.prod(ch.shard.local_shape) // len(ch.shard.local_chunks))
            for ch in chunks_of(shards, topology) if len(ch.owners) > 1]


def plan_buckets(items: list[Item], bucket_numel: int) -> list[list[Item]]:
    """Items grouped by owner set into buckets of at most `bucket_numel` elements (one item may exceed
    it), each in backward order; the buckets in launch order (see the module's docstring)."""
    by_owners: dict[RankSet, list[Item]] = {}
    for item in sorted(items, key=lambda it: it.key):
        by_owners.setdefault(item.chunk.owners, []).append(item)
    buckets: list[list[Item]] = []
    for group in by_owners.values():
        current: list[Item] = []
        for item in group:
            if current and sum(it.numel for it in current) + item.numel > bucket_numel:
                buckets.append(current)
                current = []
            current.append(item)
        buckets.append(current)

    def launch_key(bucket: list[Item]):
        last = bucket[-1]
        # tied buckets last, by chunk: the chunk id is all their holders (on two stages) agree on
        return (1, last.chunk.chunk, 0) if last.tied else (0, *last.key)

    return sorted(buckets, key=launch_key)


@dataclass
class Bucket:
    owners: RankSet
    items: list[Item]
    flat: torch.Tensor
    viewed: list[bool]  # per item: the parameter's .grad is a view into `flat`
    params: set[str] = field(default_factory=set)  # local names with a chunk here
    pending: int = 0  # of `params`, how many still wait for their last microbatch's gradient
    work: object | None = None  # the all-reduce (or reduce-scatter) in flight
    shard: tuple[int, int] | None = None  # sharded: [start, stop) of `flat` this rank's optimizer owns

    @property
    def tied(self) -> bool:
        return self.items[-1].tied


class GradSync:
    """Owns the gradients of one rank's (main) parameters and sums them over replicas."""

    def __init__(self, params: dict[str, torch.Tensor], shards: dict[str, ParamShard], topology: Topology,
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL, num_microbatches: int = 1,
                 leaves: dict[str, torch.Tensor] | None = None, overlap: bool = False, sharded: bool = False):
        """params: the fp32 main parameters by local name; leaves: the model's parameters (autograd's
        leaves, whose accumulation hooks fire; default `params`, as in fp32 runs); num_microbatches:
        backward passes per step, after which a gradient is final; sharded: reduce-scatter each bucket
        (the distributed optimizer's layout) instead of all-reducing it."""
        self.topology, self.params = topology, params
        self.num_microbatches, self.overlap, self.sharded = num_microbatches, overlap, sharded
        self.buckets = [self._bucket(b) for b in plan_buckets(bucket_items(shards, topology), bucket_numel)]
        self._viewed = {it.name for b in self.buckets for it, v in zip(b.items, b.viewed) if v}
        self._buckets_of: dict[str, list[Bucket]] = {}
        for bucket in self.buckets:
            for name in bucket.params:
                self._buckets_of.setdefault(name, []).append(bucket)
        self._arrived: Counter = Counter()
        self._next = 0  # the next bucket to start, in self.buckets (launch order)
        self.started_in_backward = 0  # of the last step's buckets, how many started before `finish`
        for name, leaf in (leaves or params).items():
            if name in self._buckets_of and not any(b.tied for b in self._buckets_of[name]):
                leaf.register_post_accumulate_grad_hook(self._on_gradient(name))
        self.zero_grad()

    def _bucket(self, items: list[Item]) -> Bucket:
        params, owners = self.params, items[0].chunk.owners
        numel = sum(it.numel for it in items)
        shard = None
        if self.sharded:  # pad to d equal parts; this rank owns the part of its rank in the group
            part = -(-numel // len(owners))
            position = dist.get_group_rank(self.topology.group(owners), self.topology.rank)
            shard, numel = (position * part, (position + 1) * part), part * len(owners)
        flat = torch.zeros(numel, dtype=torch.float32, device=params[items[0].name].device)
        viewed, offset = [], 0
        for it in items:
            param = params[it.name]
            whole = it.numel == param.numel() and param.dtype == torch.float32
            if whole:
                param.grad = flat[offset: offset + it.numel].view_as(param)
            viewed.append(whole)
            offset += it.numel
        return Bucket(owners, items, flat, viewed, {it.name for it in items}, shard=shard)

    def zero_grad(self) -> None:
        """Zero the bucket-held gradients in place; drop the others; a new step begins."""
        for bucket in self.buckets:
            if any(bucket.viewed):
                bucket.flat.zero_()
            bucket.pending, bucket.work = len(bucket.params), None
        for name, param in self.params.items():
            if name not in self._viewed:
                param.grad = None
        self._arrived.clear()
        self._next = 0

    # -- overlap ---------------------------------------------------------------------
    def _on_gradient(self, name: str):
        def hook(_leaf: torch.Tensor) -> None:
            if not self.overlap:
                return
            self._arrived[name] += 1
            seen = self._arrived[name]
            if seen > self.num_microbatches:
                raise RuntimeError(f"{name} received gradient {seen} of {self.num_microbatches} microbatches, after "
                                   "its bucket's all-reduce had started (a reentrant checkpoint?)")
            if seen < self.num_microbatches:
                return
            for bucket in self._buckets_of[name]:
                bucket.pending -= 1
            while self._next < len(self.buckets) and self.buckets[self._next].pending == 0 \
                    and not self.buckets[self._next].tied:
                self._start(self.buckets[self._next])
                self._next += 1

        return hook

    @torch.no_grad()
    def _start(self, bucket: Bucket) -> None:
        """Copy the chunks that are not views in, scale, start the all-reduce."""
        offset = 0
        for it, viewed in zip(bucket.items, bucket.viewed):
            segment = bucket.flat[offset: offset + it.numel]
            offset += it.numel
            if not viewed:
                param = self.params[it.name]
                if param.grad is None:  # no gradient reached it this step
                    param.grad = torch.zeros_like(param)
                view = it.chunk.shard.chunk_view(param.grad, it.chunk.chunk)
                segment.view(view.shape).copy_(view)
            if it.scale != 1.0:
                segment.mul_(it.scale)
        group = self.topology.group(bucket.owners)
        if bucket.shard is None:
            bucket.work = dist.all_reduce(bucket.flat, group=group, async_op=True)
        else:  # in place: this rank's part of the buffer receives its sum
            bucket.work = dist.reduce_scatter_tensor(bucket.flat[slice(*bucket.shard)], bucket.flat, group=group,
                                                     async_op=True)

    @torch.no_grad()
    def finish(self) -> None:
        """Start the buckets not started yet, in order, and wait for all: afterwards every local
        gradient is its sum over the replicas of its stage (sharded: every element of this rank's part
        of each bucket; the optimizer reads nothing else)."""
        self.started_in_backward = self._next
        for bucket in self.buckets[self._next:]:
            self._start(bucket)
        self._next = len(self.buckets)
        for bucket in self.buckets:
            bucket.work.wait()
            if bucket.shard is not None:
                continue
            offset = 0
            for it, viewed in zip(bucket.items, bucket.viewed):
                if not viewed:
                    view = it.chunk.shard.chunk_view(self.params[it.name].grad, it.chunk.chunk)
                    view.copy_(bucket.flat[offset: offset + it.numel].view(view.shape))
                offset += it.numel

    @property
    def num_collectives(self) -> int:
        return len(self.buckets)
