"""Rebuild a new plan's shards from the snapshots its ranks hold in host memory.

After a reconfiguration every rank of the new plan needs its slice of every
logical tensor (the parameter and its optimizer state) at one common step.
The ranks that survived hold their old slices, from the old plan, in their
two newest snapshots (snapshot.SnapshotRing). The ranks exchange what they
hold and what they need (small tuples, one all_gather_object), pick the
newest step whose held slices cover every need, and compute the same
transfer schedule everywhere; then every pair of ranks exchanges one flat
buffer (one batch_isend_irecv) and each rank copies the slices into its
parameters and optimizer state. Nothing touches the disk. Snapshots are host
memory; the buffers that travel are copied to the rank's device first and
received there (NCCL moves CUDA tensors only; devices.py). When the survivors
do not cover some need (every holder of a stage died), `plan_transfers`
returns None and the caller falls back to the newest checkpoint on disk.

Sources are picked deterministically: the rank itself first (a local copy),
then ranks on the same node, then the least loaded, then the lowest rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_ext.sharding import ParamShard
from sailor_ext.snapshot import Snapshot, SnapshotRing


@dataclass(frozen=True)
class Held:
    """A slice of a logical tensor in one rank's snapshot of one step."""

    step: int
    name: str  # logical tensor
    dim: int | None
    start: int  # along dim, logical coordinates; (0, 0) for a whole tensor
    stop: int
    local: str  # the holder's local parameter name
    logical_shape: tuple[int, ...]


@dataclass(frozen=True)
class Need:
    """A slice a rank of the new plan must fill."""

    name: str
    dim: int | None
    start: int
    stop: int
    shape: tuple[int, ...]  # local shape
    local: str  # the needing rank's local parameter name
    logical_shape: tuple[int, ...]


@dataclass(frozen=True)
class StepInfo:
    """What every rank's snapshot of one step says about the run's position."""

    step: int
    consumed: int
    optimizer_steps: int
    state_keys: tuple[str, ...]
    loss_scaler: dict | None = None  # fp16's scaler state (precision.LossScaler)


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    need: int  # index into the destination's needs
    held_local: str  # source's local parameter name
    src_offset: int  # along dim, in the source's local tensor
    dst_offset: int  # along dim, in the destination's local tensor
    length: int  # along dim (0: the whole tensor)

    def numel(self, need: Need, num_keys: int) -> int:
        n = 1
        for i, d in enumerate(need.shape):
            n *= self.length if (need.dim is not None and i == need.dim) else d
        return n * num_keys


def holdings(ring: SnapshotRing) -> tuple[list[Held], list[StepInfo]]:
    held, infos = [], []
    for snap in ring.slots:
        infos.append(StepInfo(snap.step, snap.consumed, snap.optimizer_steps, snap.state_keys, snap.loss_scaler))
        for local, shard in snap.shards.items():
            start, stop = shard.local_range()
            held.append(Held(snap.step, shard.name, shard.dim, start, stop, local, shard.logical_shape))
    return held, infos


def needs_of(shards: dict[str, ParamShard]) -> list[Need]:
    out = []
    for local, shard in shards.items():
        start, stop = shard.local_range()
        out.append(Need(shard.name, shard.dim, start, stop, shard.local_shape, local, shard.logical_shape))
    return out


def plan_transfers(held: list[list[Held]], infos: list[list[StepInfo]], needs: list[list[Need]],
                   nodes: list[int], min_step: int = -1) -> tuple[StepInfo, list[Transfer]] | None:
    """The newest step (>= min_step) that the held slices cover for every need, and who sends what.

    held[r], infos[r], needs[r]: rank r's holdings, snapshot steps and needs
    (in the new plan's ranks); nodes[r]: its node, to prefer local sources.
    """
    by_step: dict[int, StepInfo] = {}
    for rank_infos in infos:
        for info in rank_infos:
            by_step.setdefault(info.step, info)
    for step in sorted((s for s in by_step if s >= min_step), reverse=True):
        schedule = _cover(step, held, needs, nodes)
        if schedule is not None:
            return by_step[step], schedule
    return None


def _cover(step: int, held: list[list[Held]], needs: list[list[Need]], nodes: list[int]) -> list[Transfer] | None:
    pieces: dict[str, list[tuple[int, Held]]] = {}
    for rank, items in enumerate(held):
        for h in items:
            if h.step == step:
                pieces.setdefault(h.name, []).append((rank, h))
    load = [0] * len(held)
    out: list[Transfer] = []
    for dst, rank_needs in enumerate(needs):
        for i, need in enumerate(rank_needs):
            candidates = [(r, h) for r, h in pieces.get(need.name, [])
                          if h.dim == need.dim and h.logical_shape == need.logical_shape]

            def preference(item, dst=dst):
                r, _ = item
                return (r != dst, nodes[r] != nodes[dst], load[r], r)

            if need.dim is None:
                if not candidates:
                    return None
                r, h = min(candidates, key=preference)
                out.append(Transfer(r, dst, i, h.local, 0, 0, 0))
                load[r] += 1
                continue
            pos = need.start
            while pos < need.stop:
                covering = [(r, h) for r, h in candidates if h.start <= pos < h.stop]
                if not covering:
                    return None
                r, h = min(covering, key=preference)
                end = min(h.stop, need.stop)
                out.append(Transfer(r, dst, i, h.local, pos - h.start, pos - need.start, end - pos))
                load[r] += end - pos
                pos = end
    return out


def _slice(t: torch.Tensor, dim: int | None, offset: int, length: int) -> torch.Tensor:
    return t if dim is None else t.narrow(dim, offset, length)


@torch.no_grad()
def exchange(ring: SnapshotRing, params: dict[str, torch.Tensor] | None, optimizer,
             shards: dict[str, ParamShard] | None, nodes: list[int], device: torch.device, min_step: int = -1,
             group=None) -> StepInfo | None:
    """Fill this rank's (fp32 main) parameters and optimizer state from the ranks' snapshots
    (collective over `group`). Returns the step restored, or None if the
    snapshots cover no step >= min_step (then nothing was changed). A donor
    (a rank outside the plan) passes params=shards=None: it only sends."""
    me, world = dist.get_rank(group), dist.get_world_size(group)
    mine = holdings(ring)
    my_needs = needs_of(shards) if shards is not None else []
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (mine[0], mine[1], my_needs), group=group)
    held = [g[0] for g in gathered]
    infos = [g[1] for g in gathered]
    needs = [g[2] for g in gathered]
    chosen = plan_transfers(held, infos, needs, nodes, min_step)
    if chosen is None:
        return None
    info, transfers = chosen
    keys = ("param", *info.state_keys)
    snap: Snapshot | None = next((s for s in ring.slots if s.step == info.step), None)

    outgoing: dict[int, list[torch.Tensor]] = {}
    incoming: dict[int, list[Transfer]] = {}
    for t in transfers:
        if t.src == me and t.dst != me:
            need = needs[t.dst][t.need]
            src = snap.tensors[t.held_local]
            outgoing.setdefault(t.dst, []).extend(
                _slice(src[k], need.dim, t.src_offset, t.length).reshape(-1) for k in keys)
        elif t.dst == me and t.src != me:
            incoming.setdefault(t.src, []).append(t)
    ops, buffers = [], {}
    for dst, parts in sorted(outgoing.items()):
        ops.append(dist.P2POp(dist.isend, torch.cat(parts).to(device), dst, group))  # host -> device
    for src, items in sorted(incoming.items()):
        n = sum(t.numel(my_needs[t.need], len(keys)) for t in items)
        buffers[src] = torch.empty(n, dtype=torch.float32, device=device)
        ops.append(dist.P2POp(dist.irecv, buffers[src], src, group))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    filled = {i: {k: torch.empty(n.shape, device=device) for k in keys} for i, n in enumerate(my_needs)}
    offsets = dict.fromkeys(buffers, 0)
    for t in transfers:
        if t.dst != me:
            continue
        need = my_needs[t.need]
        for k in keys:
            target = _slice(filled[t.need][k], need.dim, t.dst_offset, t.length)
            if t.src == me:
                target.copy_(_slice(snap.tensors[t.held_local][k], need.dim, t.src_offset, t.length))
            else:
                n = target.numel()
                target.copy_(buffers[t.src][offsets[t.src]: offsets[t.src] + n].view(target.shape))
                offsets[t.src] += n
    if shards is None:
        return info
    optimizer.step_count = info.optimizer_steps
    restore_state = tuple(info.state_keys) == tuple(optimizer.state_keys)
    for i, need in enumerate(my_needs):
        shards[need.local].view(params[need.local]).copy_(filled[i]["param"])
        if restore_state and info.state_keys:
            optimizer.set_state(need.local, {k: filled[i][k] for k in info.state_keys})
    return info
