"""Activations and their gradients between consecutive stages of a pipeline.

Both sides of a stage boundary hold the tensor whole on every TP rank (a
stage's output is all-reduced by its last row-parallel layer; the input
gradient is all-reduced by the first column-parallel layer). The two stages
may have different TP degrees a and b, so the tensor is resharded at the
boundary instead of being sent b times: it is cut into L = max(a, b) equal
chunks, chunk c goes from sender TP rank c % a to receiver TP rank c % b, and
the receivers all-gather the chunks over their TP group. Each chunk crosses
the boundary once (the slow, possibly cross-zone link); the all-gather stays
inside the receiving node. Megatron's scatter-gather optimisation is the case
a == b.

All sends and receives of one schedule step are posted together
(batch_isend_irecv), as Megatron does, so 1F1B cannot deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_ext.topology import Topology


@dataclass(frozen=True)
class Boundary:
    """The link between TP group `senders` (a ranks) and `receivers` (b ranks)."""

    senders: tuple[int, ...]
    receivers: tuple[int, ...]

    @property
    def num_chunks(self) -> int:
        return max(len(self.senders), len(self.receivers))

    def sends(self, rank: int) -> list[tuple[int, int]]:
        """(chunk, destination rank) pairs for sender `rank`."""
        a, b = len(self.senders), len(self.receivers)
        i = self.senders.index(rank)
        return [(c, self.receivers[c % b]) for c in range(i, self.num_chunks, a)]

    def recvs(self, rank: int) -> list[tuple[int, int]]:
        """(chunk, source rank) pairs for receiver `rank`, by chunk."""
        a, b = len(self.senders), len(self.receivers)
        j = self.receivers.index(rank)
        return [(c, self.senders[c % a]) for c in range(j, self.num_chunks, b)]


def reassemble(gathered: torch.Tensor, num_receivers: int, num_chunks: int) -> torch.Tensor:
    """Chunks in order from the receivers' all-gather: receiver j held chunks
    j, j + b, j + 2b, ... so chunk c sits at [c % b, c // b]."""
    return gathered.view(num_receivers, num_chunks // num_receivers, -1).transpose(0, 1).reshape(-1)


def _flat_chunks(tensor: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """[num_chunks, chunk] view of the flattened tensor, zero-padded to fit."""
    flat = tensor.reshape(-1)
    pad = -flat.numel() % num_chunks
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(num_chunks, -1)


class PendingRecv:
    """Chunks being received; `finish` all-gathers them into the whole tensor."""

    def __init__(self, boundary: Boundary, rank: int, shape: torch.Size, dtype, device, tp_group):
        self.boundary, self.shape, self.tp_group = boundary, shape, tp_group
        numel = 1
        for d in shape:
            numel *= d
        self.numel = numel
        chunk = -(-numel // boundary.num_chunks)
        self.plan = boundary.recvs(rank)
        self.local = torch.empty(len(self.plan), chunk, dtype=dtype, device=device)

    def ops(self) -> list[dist.P2POp]:
        return [dist.P2POp(dist.irecv, self.local[i], src) for i, (_, src) in enumerate(self.plan)]

    def finish(self) -> torch.Tensor:
        b, L = len(self.boundary.receivers), self.boundary.num_chunks
        if b == 1:
            whole = self.local.reshape(-1)
        else:
            gathered = torch.empty(b * self.local.numel(), dtype=self.local.dtype, device=self.local.device)
            dist.all_gather_into_tensor(gathered, self.local.reshape(-1), group=self.tp_group)
            whole = reassemble(gathered, b, L)
        return whole[: self.numel].view(self.shape)


class StageLinks:
    """This rank's boundaries to the previous and next stage of its pipeline."""

    def __init__(self, topology: Topology, dtype: torch.dtype):
        self.topology, self.dtype = topology, dtype
        layout, s, k = topology.layout, topology.stage, topology.replica
        mine = layout.tp_group(s, k)
        prev = layout.tp_group(s - 1, k) if s > 0 else None
        after = layout.tp_group(s + 1, k) if s < topology.num_stages - 1 else None
        # one Boundary per direction and neighbour; both ends build the same one
        self.to_next = Boundary(mine, after) if after else None  # activations out
        self.from_prev = Boundary(prev, mine) if prev else None  # activations in
        self.to_prev = Boundary(mine, prev) if prev else None  # input gradients out
        self.from_next = Boundary(after, mine) if after else None  # output gradients in

    def exchange(self, *, send_next: torch.Tensor | None = None, send_prev: torch.Tensor | None = None,
                 recv_prev: torch.Size | None = None, recv_next: torch.Size | None = None):
        """Post the given sends/receives together; return (from_prev, from_next).

        send_next: activation to the next stage; send_prev: input gradient to
        the previous stage; recv_prev/recv_next: shapes to receive from them.
        """
        rank, device = self.topology.rank, self.topology.device
        ops, pending = [], {}
        for tensor, boundary in ((send_next, self.to_next), (send_prev, self.to_prev)):
            if tensor is not None:
                chunks = _flat_chunks(tensor.detach().to(self.dtype), boundary.num_chunks)
                ops += [dist.P2POp(dist.isend, chunks[c], dst) for c, dst in boundary.sends(rank)]
        for key, shape, boundary in (("prev", recv_prev, self.from_prev), ("next", recv_next, self.from_next)):
            if shape is not None:
                pending[key] = PendingRecv(boundary, rank, shape, self.dtype, device, self.topology.tp_group)
                ops += pending[key].ops()
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        out = {key: p.finish() for key, p in pending.items()}
        return out.get("prev"), out.get("next")
