"""What the simulator assumes about the framework that executes a plan.

Two frameworks run plans: Megatron-DeepSpeed (the runs behind Sailor's
published measurements, and so any plan read in Sailor's format) and our own
runtime, `sailor_ext`. They keep different state per parameter and move
activations differently; everything else (the 1F1B schedule, blocking p2p,
gradient sync after the last backward, block-wise recomputation where a
stage asks for it) they share.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import SailorError


@dataclass(frozen=True)
class RuntimeModel:
    """What the simulator needs to know of the framework that runs a plan: its state bytes, p2p and memory habits."""

    name: str
    # Bytes of persistent state per parameter, by precision:
    #   fp32: weights 4 + gradients 4 + Adam moments 8 = 16, plus framework buffers;
    #   bf16 (and fp16): 16-bit weights 2 + fp32 main gradients 4 + fp32 master weights 4 + Adam 8 = 18.
    state_bytes_fp32: float
    state_bytes_bf16: float
    # False: the whole activation crosses one GPU's link (Megatron-DeepSpeed:
    # each TP rank sends its full copy to its peer over its own link; the
    # Clariden runs, one NIC per GPU, take exactly one link's time for the whole
    # tensor, and the MIT runs, one NIC per node, show no TP-fold slowdown).
    # True: the activation is split over the TP ranks' links and all-gathered
    # on the receiving side (sailor_ext).
    p2p_split_over_tp: bool
    # Bytes per parameter the optimizer step allocates for itself, beyond the
    # persistent state (memory.py: the step's peak, after every activation is
    # freed). torch's foreach AdamW (sailor_ext) computes sqrt(v) into a new
    # fp32 tensor per parameter: 4 B/parameter. A fused Adam kernel
    # (Megatron-DeepSpeed's Apex FusedAdam) updates in place: 0.
    optimizer_step_bytes: float = 0.0
    # PyTorch's caching allocator holds more than the live tensors: segments are
    # rounded and fragment. Measured peak / live activation bytes.
    allocator_factor: float = 1.10
    # Bytes per parameter of optimizer state (Adam's two fp32 moments) that the distributed
    # optimizer (ZeRO-1, sailor_ext/distributed_optimizer.py) splits over the d replicas of a
    # stage: each keeps 8/d of them (and steps, so allocates W/d, for its part). 0: the runtime
    # has no distributed optimizer.
    sharded_state_bytes: float = 0.0

    def state_bytes(self, precision: str, shards: float = 1) -> float:
        """Bytes per parameter in `precision` (fp16 keeps what bf16 keeps), the optimizer state split
        `shards` ways:  S(d) = S - 8 (1 - 1/d)."""
        whole = self.state_bytes_fp32 if precision == "fp32" else self.state_bytes_bf16
        return whole - self.sharded_state_bytes * (1 - 1 / shards)


RUNTIMES = {
    # DeepSpeed fp32 keeps a flat gradient buffer for its all-reduce and a
    # second fp32 copy of the weights next to 16 B of weights, grads and Adam
    # state: 24 B/parameter (also Sailor's own accounting).
    "megatron-deepspeed": RuntimeModel("megatron-deepspeed", 24.0, 26.0, p2p_split_over_tp=False),
    # sailor_ext: gradients live in one flat buffer per stage (no extra copy).
    # Checked (not fitted) on an H100: the 1.1 B LLaMA's recomputing plans peaked at 22.60-22.67 GiB
    # allocated, 18 + 4 B/parameter (22.54 GiB), above their activations' peak (docs/profiler.md).
    "sailor": RuntimeModel("sailor", 16.0, 18.0, p2p_split_over_tp=True, optimizer_step_bytes=4.0,
                           sharded_state_bytes=8.0),
}


def runtime_model(name: str) -> RuntimeModel:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise SailorError(f"unknown runtime {name!r}: use one of {', '.join(RUNTIMES)}") from None
