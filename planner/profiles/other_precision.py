"""A profile measured in one precision, used for a plan in another.

Sailor's published profiles were measured in fp32 (Megatron-DeepSpeed with fp32
weights), while a GPU plan trains in bf16 or fp16 by default. Using fp32 numbers
as they are would overstate both time and activation memory, so a measured
profile is converted, layer by layer:

    t'  = t * est(target) / est(measured)      per layer, microbatch size and TP degree: the
                                               estimator's ratio (estimate.layer_seconds: tensor-
                                               core peak, bytes of memory-bound kernels and of
                                               the TP all-reduce in the new dtype), at
                                               DEFAULT_EFFICIENCY (fitted to all of Sailor's
                                               profiles; calibrating on the profiles at hand
                                               would cost every `sailor plan` 70 ms)         [s]
    A'  = A * bytes(target) / bytes(measured)  activation, output (p2p) and workspace bytes; the
                                               runtimes keep every saved tensor in the compute
                                               dtype (dropout masks and fp32 softmax statistics
                                               are not, which this ignores)                  [B/sample]
    P'  = P                                    parameter counts; the bytes of state per parameter
                                               follow the precision (runtime_model.state_bytes)
    u'  = u                                    the optimizer steps fp32 master weights either way

The converted profile keeps its source (measured) and says in
meta["converted_from"] which precision was measured.
"""
from __future__ import annotations

from dataclasses import replace

from planner.profiles.estimate import DEFAULT_EFFICIENCY, DTYPE_BYTES, Efficiency, layer_seconds
from planner.profiles.profile import LayerMemory, LayerTimes, Profile
from planner.specs.hardware import GPUSpec
from planner.specs.model import ModelSpec


def converted_memory(memory: dict[int, LayerMemory], measured: str, target: str) -> dict[int, LayerMemory]:
    """Memory facts measured in `measured` precision, for `target`."""
    if measured == target:
        return memory
    k = DTYPE_BYTES[target] / DTYPE_BYTES[measured]

    def scale(xs):
        return tuple(k * x for x in xs) if xs else xs

    return {tp: LayerMemory(m.params, scale(m.activation_bytes), scale(m.output_bytes), scale(m.workspace_bytes))
            for tp, m in memory.items()}


def converted_profile(profile: Profile, model: ModelSpec, gpu: GPUSpec, target: str,
                      eff: Efficiency = DEFAULT_EFFICIENCY) -> Profile:
    """`profile` (measured in profile.precision) for a plan in `target` precision."""
    if profile.precision == target:
        return profile
    kinds = {model.kind(layer): layer for layer in range(model.num_layers)}  # all blocks do the same work
    times = {}
    for (mbs, tp), lt in profile.times.items():
        ratio = {}
        for kind, layer in kinds.items():
            old = layer_seconds(model, layer, mbs, tp, gpu, profile.precision, eff)
            new = layer_seconds(model, layer, mbs, tp, gpu, target, eff)
            ratio[kind] = (new[0] / old[0], new[1] / old[1])
        rows = [ratio[model.kind(layer)] for layer in range(model.num_layers)]
        times[(mbs, tp)] = LayerTimes(tuple(t * r[0] for t, r in zip(lt.fwd, rows)),
                                      tuple(t * r[1] for t, r in zip(lt.bwd, rows)))
    return replace(profile, precision=target, times=times,
                   memory=converted_memory(profile.memory, profile.precision, target),
                   meta={**profile.meta, "converted_from": profile.precision})
