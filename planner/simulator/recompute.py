"""Activation recomputation: what it does to a layer's time and memory.

A stage that recomputes runs every transformer block under activation
checkpointing (Megatron's "full" recomputation, one block per checkpoint).
The embedding and the head run as usual. Per block l, for one microbatch:

    bwd'_l   = bwd_l + fwd_l        backward first reruns the block's forward  [s]
    kept'_l  = out_{l-1}            only the block's input stays in memory     [B/sample]
    work'_l  = kept_l               the rerun rebuilds what the block kept,
                                    for the one block in backward at a time    [B/sample]

so a stage's activations in flight shrink from sum_l kept_l to sum_l out_{l-1}
per microbatch (an OPT-350 block keeps 8-43x its input, at TP 8..1) for one more
forward of compute. Both are pure functions of the measured per-layer numbers.
"""
from __future__ import annotations

from planner.profiles.profile import LayerMemory, LayerTimes


def recomputed_times(times: LayerTimes, blocks: tuple[bool, ...]) -> LayerTimes:
    """Per-layer seconds when the layers flagged in `blocks` are recomputed."""
    return LayerTimes(times.fwd, tuple(b + f if r else b for f, b, r in zip(times.fwd, times.bwd, blocks)))


def recomputed_memory(mem: LayerMemory, blocks: tuple[bool, ...]) -> LayerMemory:
    """Per-layer memory facts when the layers flagged in `blocks` are recomputed."""
    kept = tuple(mem.output_bytes[i - 1] if r and i > 0 else a
                 for i, (a, r) in enumerate(zip(mem.activation_bytes, blocks)))
    return LayerMemory(mem.params, kept, mem.output_bytes, mem.workspace_bytes or mem.activation_bytes)
