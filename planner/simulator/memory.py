"""Peak memory of one GPU of a replica (bytes).

    M = R_gpu                                   runtime overhead: CUDA context, cuBLAS, NCCL buffers
      + S * P_stage(t)                          persistent state: S bytes per parameter (runtime_model)
      + max(f * b * (n_inflight * A_stage(t)    activations of the microbatches in flight
                     + A_max(t)),               + backward workspace of the largest layer,
            W * P_stage(t))                     or the optimizer step's own tensors, W bytes per
                                                parameter, allocated once every activation is freed
    n_inflight = min(pp - s, num_microbatches)  1F1B keeps at most pp - s forward passes open on stage s

P_stage(t): parameters of the stage's layers on one GPU of a TP-t group (plus a
copy of the word embedding on the last stage when embeddings are tied and the
head is not on the embedding's stage). A_stage(t): activation bytes the stage
keeps per sample; A_max(t) the largest single layer's backward workspace (as
large as what the layer stored; with recomputation, as large as what it would
have stored, see recompute.py). f is the allocator
factor (runtime_model), b the microbatch size, s the 0-based stage index. With the
distributed optimizer the stage's D replicas split the optimizer state and step:
S = S_whole - 8 (1 - 1/D) (Adam's moments, 8/D B/parameter each) and W / D
(RuntimeModel.state_bytes; tensors each TP rank keeps whole are split D*tp ways
by the runtime, counted D ways here).
"""
from __future__ import annotations

from planner.profiles.profile import LayerMemory


def replica_memory(mem: LayerMemory, first: int, last: int, *, mbs: int, inflight: int,
                   state_bytes_per_param: float, allocator_factor: float, overhead_bytes: float,
                   optimizer_step_bytes: float = 0.0, extra_params: int = 0) -> float:
    params = mem.stage_params(first, last) + extra_params
    acts = mem.stage_activation_bytes(first, last)
    workspace = mem.stage_workspace_bytes(first, last)
    transient = allocator_factor * mbs * (inflight * acts + workspace)
    return overhead_bytes + state_bytes_per_param * params + max(transient, optimizer_step_bytes * params)


def memory_parts(mem: LayerMemory, first: int, last: int, *, mbs: int, inflight: int, state_bytes_per_param: float,
                 allocator_factor: float, overhead_bytes: float, optimizer_step_bytes: float = 0.0,
                 extra_params: int = 0) -> dict[str, float]:
    """The terms of replica_memory, in bytes (for reports and plots); the last is what the optimizer
    step needs beyond the activations' peak (0 when the activations need more)."""
    params = mem.stage_params(first, last) + extra_params
    acts = allocator_factor * mbs * inflight * mem.stage_activation_bytes(first, last)
    workspace = allocator_factor * mbs * mem.stage_workspace_bytes(first, last)
    return {"runtime": overhead_bytes, "weights, grads, optimizer": state_bytes_per_param * params,
            "activations": acts, "backward workspace": workspace,
            "optimizer step": max(0.0, optimizer_step_bytes * params - acts - workspace)}


def inflight_microbatches(stage: int, num_stages: int, num_microbatches: int) -> int:
    return min(num_stages - stage, num_microbatches)
