"""A profile measured in one precision, or by one runtime, used for a plan in another.

Sailor's published profiles were measured in fp32 by Megatron-DeepSpeed, while a
GPU plan trains in bf16 or fp16 by default, on our runtime (sailor_ext). Using
those numbers as they are would overstate both time and activation memory (fp32
against 16-bit; Megatron's s x s attention scores against fused attention), so a
measured profile is converted, layer by layer:

    t'  = t * est(target) / est(measured)      per layer, microbatch size and TP degree: the
                                               estimator's ratio (estimate.layer_seconds: tensor-
                                               core peak, bytes of memory-bound kernels and of
                                               the TP all-reduce in the new dtype, the runtime's
                                               attention), at DEFAULT_EFFICIENCY (fitted to all
                                               of Sailor's profiles; calibrating on the profiles
                                               at hand would cost every `sailor plan` 70 ms)  [s]
    A'  = A * act(target) / act(measured)      activation bytes per layer: the estimator's count
                                               (estimate.activation_floats, in the dtype's bytes);
                                               output (p2p) and workspace bytes by the dtype's
                                               bytes. The runtimes keep every saved tensor in
                                               the compute dtype (dropout masks and fp32 softmax
                                               statistics are not, which this ignores)  [B/sample]
    P'  = P                                    parameter counts; the bytes of state per parameter
                                               follow the precision (runtime_model.state_bytes)
    u'  = u * opt(target) / opt(measured)      the optimizer step, by the runtimes' bytes per
                                               parameter (estimate.RuntimeWork)             [s/param]

The converted profile keeps its source (measured) and says in meta which
precision and runtime were measured ("converted_from", "converted_from_runtime").
"""
from __future__ import annotations

from dataclasses import replace

from planner.profiles.estimate import (DEFAULT_EFFICIENCY, DTYPE_BYTES, RUNTIME_WORK, Efficiency, activation_floats,
                                       layer_seconds, per_layer)
from planner.profiles.profile import LayerMemory, LayerTimes, Profile
from planner.specs.hardware import GPUSpec
from planner.specs.model import ModelSpec


def converted_memory(memory: dict[int, LayerMemory], model: ModelSpec, measured: str, target: str,
                     measured_runtime: str, runtime: str) -> dict[int, LayerMemory]:
    """Memory facts measured in `measured` precision by `measured_runtime`, for `target` and `runtime`."""
    if measured == target and measured_runtime == runtime:
        return memory
    k = DTYPE_BYTES[target] / DTYPE_BYTES[measured]

    def scale(xs):
        return tuple(k * x for x in xs) if xs else xs

    def saved(layer: int, tp: int) -> float:  # the target runtime's saved tensors per the measured one's
        old = activation_floats(model, layer, tp, measured_runtime)
        return activation_floats(model, layer, tp, runtime) / old if old > 0 else 1.0

    out = {}
    for tp, m in memory.items():
        acts = m.activation_bytes
        if measured_runtime != runtime:
            acts = tuple(a * saved(layer, tp) for layer, a in enumerate(acts))
        out[tp] = LayerMemory(m.params, scale(acts), scale(m.output_bytes), scale(m.workspace_bytes))
    return out


def converted_profile(profile: Profile, model: ModelSpec, gpu: GPUSpec, target: str, runtime: str,
                      eff: Efficiency = DEFAULT_EFFICIENCY) -> Profile:
    """`profile` (measured in profile.precision by profile.runtime) for a plan in `target` precision
    run by `runtime`."""
    measured_runtime = profile.runtime or runtime
    if profile.precision == target and measured_runtime == runtime:
        return profile
    times = {}
    for (mbs, tp), lt in profile.times.items():
        def ratio(layer):
            old = layer_seconds(model, layer, mbs, tp, gpu, profile.precision, eff, measured_runtime)
            new = layer_seconds(model, layer, mbs, tp, gpu, target, eff, runtime)
            return new[0] / old[0], new[1] / old[1]

        rows = per_layer(model, (measured_runtime, runtime), ratio)
        times[(mbs, tp)] = LayerTimes(tuple(t * r[0] for t, r in zip(lt.fwd, rows)),
                                      tuple(t * r[1] for t, r in zip(lt.bwd, rows)))
    opt = (RUNTIME_WORK[runtime].optimizer_bytes(target)
           / RUNTIME_WORK[measured_runtime].optimizer_bytes(profile.precision))
    return replace(profile, precision=target, times=times,
                   optimizer_s_per_param=profile.optimizer_s_per_param * opt,
                   memory=converted_memory(profile.memory, model, profile.precision, target, measured_runtime,
                                           runtime),
                   meta={**profile.meta, "converted_from": profile.precision, "converted_from_runtime":
                         measured_runtime, "runtime": runtime})
