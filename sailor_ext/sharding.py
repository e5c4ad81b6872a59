"""How a local parameter maps onto its plan-independent logical tensor.

Every parameter has a logical name (`layers.<model layer>.<path>`, numbered
as in planner's ModelSpec) and a logical shape: the tensor a single-GPU run
would hold. A TP rank holds either the whole tensor (norms, row-parallel
biases, position embeddings) or a contiguous slice along one dimension
(Megatron's column/row-parallel and vocab-parallel layouts).

A logical tensor may have more dimensions than the module's parameter: with
SwiGLU, megatron's fc1 holds [gate rows; up rows] of its TP slice, so the
logical tensor is [2, ffn, h] split along dim 1 and `view` shows a local
parameter (or its gradient or optimizer state) in that layout.

Different replicas may hold different slices (TP 2 vs TP 4), so we cut every
sharded tensor into `num_chunks` equal chunks, the largest TP degree among
all its holders; chunk c is the unit of gradient reduction, of the global
gradient norm and of checkpoint pieces. Each chunk has a set of owners (one
rank per replica) and a designated owner, the lowest rank among them, which
counts it once in the global norm and writes it to checkpoints.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sailor_ext.topology import RankSet, Topology


@dataclass(frozen=True)
class ParamShard:
    """One local parameter: its logical tensor and the slice this rank holds."""

    name: str  # logical name
    logical_shape: tuple[int, ...]
    dim: int | None  # partition dimension; None when every TP rank holds it whole
    tp: int
    tp_rank: int
    num_chunks: int  # finest common chunking over all holders (1 when whole)
    stages: tuple[int, ...]  # stages holding the logical tensor (two for tied embeddings)
    # held whole, but each TP rank's gradient covers only its own heads (per-head q/k norms): the
    # replica's gradient is the sum over its TP ranks, not any one rank's copy
    partial_grad: bool = False

    @property
    def local_shape(self) -> tuple[int, ...]:
        if self.dim is None:
            return self.logical_shape
        shape = list(self.logical_shape)
        shape[self.dim] //= self.tp
        return tuple(shape)

    @property
    def chunk_len(self) -> int:
        return self.logical_shape[self.dim] // self.num_chunks if self.dim is not None else 0

    @property
    def local_chunks(self) -> range:
        """Chunk ids this rank holds."""
        per_rank = self.num_chunks // self.tp if self.dim is not None else 1
        first = self.tp_rank * per_rank if self.dim is not None else 0
        return range(first, first + per_rank)

    def local_range(self) -> tuple[int, int]:
        """[start, stop) of the local slice along `dim`, in logical coordinates."""
        if self.dim is None:
            return 0, 0
        size = self.logical_shape[self.dim] // self.tp
        return self.tp_rank * size, (self.tp_rank + 1) * size

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """[start, stop) of chunk `chunk` along `dim`, in logical coordinates."""
        return chunk * self.chunk_len, (chunk + 1) * self.chunk_len

    def view(self, local: torch.Tensor) -> torch.Tensor:
        """A local tensor (param, grad, optimizer state) in the logical layout (local_shape)."""
        return local.view(self.local_shape)

    def chunk_view(self, local: torch.Tensor, chunk: int) -> torch.Tensor:
        """The part of the local tensor (param, grad, optimizer state) in `chunk`."""
        if self.dim is None:
            return local
        start = (chunk - self.local_chunks.start) * self.chunk_len
        return self.view(local).narrow(self.dim, start, self.chunk_len)

    def shard_of(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full logical tensor (in local_shape; copy it into view(param))."""
        if self.dim is None:
            return full
        start, stop = self.local_range()
        return full.narrow(self.dim, start, stop - start)


@dataclass(frozen=True)
class Chunk:
    """One chunk of one local parameter and who else holds it."""

    param_name: str  # local (module) parameter name
    shard: ParamShard
    chunk: int
    owners: RankSet

    @property
    def designated(self) -> int:
        return self.owners[0]


def chunks_of(shards: dict[str, ParamShard], topology: Topology) -> list[Chunk]:
    """Every chunk of every local parameter, sorted by (logical name, chunk).

    The order is the same on every rank, so ranks that share a group agree on
    which chunk comes where in a flattened bucket.
    """
    out = []
    for param_name, shard in shards.items():
        for c in shard.local_chunks:
            if shard.dim is None:
                owners = topology.whole_owners(shard.stages)
            else:
                owners = topology.chunk_owners(shard.stages, c, shard.num_chunks)
            out.append(Chunk(param_name, shard, c, owners))
    return sorted(out, key=lambda ch: (ch.shard.name, ch.chunk))
