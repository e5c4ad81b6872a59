"""The distributed optimizer (Megatron's --use-distributed-optimizer, ZeRO stage 1).

The d ranks that hold a gradient bucket (grad_sync.py: one rank per replica
of the stage, or every rank of the stage for tensors each TP rank keeps
whole) split its flat buffer into d equal parts. Rank r of the bucket's group
keeps the optimizer state (Adam's two moments, SGD's momentum) of part r
alone and steps only the weights in it:

  1. the bucket is reduce-scattered: rank r receives the summed gradient of
     part r (the same bytes as the first half of an all-reduce);
  2. the global norm counts each element once: every part is counted by the
     rank that owns it, the chunks that only this rank holds by this rank;
  3. the optimizer steps part r of the fp32 main weights;
  4. the bucket's buffer (its gradients are spent) is all-gathered from the
     updated parts, and every rank copies the whole updated weights out.

Optimizer state memory per parameter, Adam: 8/d bytes instead of 8. The
fp32 main weights stay whole on every rank (in bf16 runs Megatron shards
them too, 4/d bytes instead of 4): snapshots, checkpoints, the elastic
reshard and `sailor export` read them without a collective. So with bf16,
2 + 4 + 4 + 8/d bytes per parameter instead of 18; with fp32, 4 + 4 + 8/d
instead of 16.

Part of a weight is stepped through a view into the main parameter where
its elements are contiguous there (the common case); a chunk of a weight that
one rank holds as several chunks along a later dimension (TP 2 beside TP 4)
is stepped as a copy, refreshed from the weights after every restore.
Elementwise, AdamW and SGD compute the same numbers on a part as on the
whole tensor.

Snapshots gather the state (copy_state_into: an all-gather per bucket and
state key, through a buffer of the bucket's size), so every rank writes and
reshards whole tensors as without the distributed optimizer: a checkpoint
resumes with or without it, under any plan.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_ext.grad_sync import Bucket, GradSync
from sailor_ext.optimizer import Optimizer, OptimizerConfig, decays
from sailor_ext.sharding import ParamShard
from sailor_ext.topology import Topology


@dataclass
class Part:
    """The elements of one bucket item in this rank's part of the bucket."""

    bucket: Bucket
    name: str  # local parameter name
    shard: ParamShard
    chunk: int
    start: int  # [start, stop) in the bucket's flat buffer
    stop: int
    offset: int  # where the item begins in the flat buffer

    def contiguous_in(self, tensor: torch.Tensor) -> bool:
        return self.shard.chunk_view(tensor, self.chunk).is_contiguous()

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """These elements of a tensor shaped as the local parameter, 1-D: a view where they are
        contiguous there, else a copy."""
        view = self.shard.chunk_view(tensor, self.chunk)
        lo, hi = self.start - self.offset, self.stop - self.offset
        return view.reshape(-1)[lo:hi] if view.is_contiguous() else view.contiguous().view(-1)[lo:hi].clone()


class DistributedOptimizer(Optimizer):
    def __init__(self, params: dict[str, torch.Tensor], shards: dict[str, ParamShard], topology: Topology,
                 config: OptimizerConfig, grad_sync: GradSync):
        """grad_sync: built with sharded=True; its buckets fix which parts this rank owns."""
        if not grad_sync.sharded:
            raise ValueError("the distributed optimizer needs GradSync(sharded=True)")
        self.topology, self.buckets = topology, grad_sync.buckets
        self.parts: list[Part] = []
        self.weights: list[torch.Tensor] = []  # per part, what the optimizer steps: 1-D fp32 (see `of`)
        for bucket in self.buckets:
            lo, hi = bucket.shard
            offset = 0
            for item in bucket.items:
                start, stop = max(lo, offset), min(hi, offset + item.numel)
                if start < stop:
                    part = Part(bucket, item.name, item.chunk.shard, item.chunk.chunk, start, stop, offset)
                    weight = part.of(params[item.name].detach())  # a leaf for torch.optim
                    weight.grad = bucket.flat[start:stop]
                    self.parts.append(part)
                    self.weights.append(weight)
                offset += item.numel
        self.sharded = {item.name for bucket in self.buckets for item in bucket.items}
        super().__init__(params, shards, topology, config)

    def _counts(self, name: str) -> bool:
        return name not in self.sharded

    def _stepped(self) -> list[tuple[torch.Tensor, bool]]:
        whole = [(p, decays(name, p)) for name, p in self.params.items() if name not in self.sharded]
        return whole + [(w, decays(part.name, self.params[part.name])) for part, w in zip(self.parts, self.weights)]

    def _norm_grads(self) -> list[torch.Tensor]:
        return super()._norm_grads() + [w.grad for w in self.weights]

    @torch.no_grad()
    def _after_step(self) -> None:
        """Every bucket's buffer <- the updated parts of all its owners; the main weights <- the buffer."""
        for part, weight in zip(self.parts, self.weights):
            part.bucket.flat[part.start:part.stop].copy_(weight)
        for bucket in self.buckets:
            dist.all_gather_into_tensor(bucket.flat, bucket.flat[slice(*bucket.shard)],
                                        group=self.topology.group(bucket.owners))
            _scatter(bucket, bucket.flat, {it.name: self.params[it.name] for it in bucket.items})
        self.params_restored()  # the copied parts <- the gathered weights

    @torch.no_grad()
    def params_restored(self) -> None:
        for part, weight in zip(self.parts, self.weights):
            if not part.contiguous_in(self.params[part.name]):
                weight.copy_(part.of(self.params[part.name]))

    # -- state ------------------------------------------------------------------------
    def state_of(self, name: str) -> dict[str, torch.Tensor]:
        if name in self.sharded:
            raise RuntimeError(f"{name}'s optimizer state is sharded: gather it with copy_state_into")
        return super().state_of(name)

    @torch.no_grad()
    def copy_state_into(self, buffers: dict[str, dict[str, torch.Tensor]]) -> None:
        """Collective over every bucket's group: whole local state tensors into `buffers`."""
        super().copy_state_into({n: b for n, b in buffers.items() if n not in self.sharded})
        if not self.state_keys or not self.buckets:
            return
        gathered = torch.empty(max(b.flat.numel() for b in self.buckets), device=self.buckets[0].flat.device)
        shaped = {n: {k: t.view(self.params[n].shape) for k, t in held.items()} for n, held in buffers.items()}
        for bucket in self.buckets:
            flat = gathered[:bucket.flat.numel()]
            mine = [(part, w) for part, w in zip(self.parts, self.weights) if part.bucket is bucket]
            for key in self.state_keys:
                flat.zero_()  # state not created yet (before the first step) is zero
                for part, weight in mine:
                    state = self.inner.state.get(weight, {}).get(key)
                    if state is not None:
                        flat[part.start:part.stop].copy_(state)
                dist.all_gather_into_tensor(flat, flat[slice(*bucket.shard)], group=self.topology.group(bucket.owners))
                _scatter(bucket, flat, {it.name: shaped[it.name][key] for it in bucket.items})

    def set_state(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """Keep this rank's parts of a local parameter's whole state tensors."""
        if name not in self.sharded:
            return super().set_state(name, tensors)
        shape = self.params[name].shape
        for part, weight in zip(self.parts, self.weights):
            if part.name == name:
                state = {k: part.of(v.reshape(shape)).to(weight.device, torch.float32).clone()
                         for k, v in tensors.items()}
                if isinstance(self.inner, torch.optim.AdamW):
                    state["step"] = torch.tensor(float(self.step_count))
                self.inner.state[weight] = state


def _scatter(bucket: Bucket, flat: torch.Tensor, into: dict[str, torch.Tensor]) -> None:
    """Copy each item of `flat` (a bucket-shaped buffer) into its chunk of into[name] (shaped as the parameter)."""
    offset = 0
    for item in bucket.items:
        view = item.chunk.shard.chunk_view(into[item.name], item.chunk.chunk)
        view.copy_(flat[offset: offset + item.numel].view(view.shape))
        offset += item.numel
