"""Analytical profiles for GPUs (or models) that were never measured.

Per layer and microbatch of b samples of s tokens, on a TP group of t GPUs:

    compute_fwd = F_layer * b * s / t / (peak * efficiency)          [s]
    compute_bwd = 2 * compute_fwd                                     [s]
    tp_comm     = n_ar * 2(t-1)/t * (b*s*h*dtype) / intra_bw          [s]  per pass, blocks: 2 fwd + 2 bwd
    embedding   = b*s*h*dtype / (hbm * efficiency)                    [s]  (a gather: memory-bound)
    each pass  += LAUNCH_S                                             [s]  (kernel launches of one layer)

F_layer are the model's forward FLOPs per token (planner.specs.model).
`efficiency` is calibrated on whatever measured profiles are loaded: the median
of (FLOPs / time / peak) over their transformer blocks at TP 1 and the largest
profiled microbatch (see `calibrate_efficiency`). With no measured profile at
hand it is DEFAULT_EFFICIENCY, the same median over Sailor's published
profiles (OPT-350 on 7 GPU types; GPT-Neo-2.7, OPT-30, LLaMA-3-8 on 2-4 each).

Optimizer step (Adam, fp32 states): every parameter reads and writes
ADAM_BYTES_PER_PARAM bytes of weights, gradients and moments at HBM speed
times the same efficiency.
"""
from __future__ import annotations

import statistics

from planner.profiles.profile import ESTIMATED, LayerMemory, LayerTimes, Profile
from planner.specs.hardware import GPUSpec
from planner.specs.model import BLOCK, EMBEDDING, ModelSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DEFAULT_EFFICIENCY = 0.36  # median of calibrate_efficiency() over sailor-data (17 profiles), Nov 2026
LAUNCH_S = 5e-5  # per layer and pass
ADAM_BYTES_PER_PARAM = 28  # read w, g, m, v (16 B); write w, m, v (12 B), fp32
MICROBATCH_SIZES = (1, 2, 4, 8, 16, 32)


def analytic_memory(model: ModelSpec, tp: int, precision: str) -> LayerMemory:
    b = DTYPE_BYTES[precision]
    s = model.seq_len
    layers = range(model.num_layers)
    return LayerMemory(
        tuple(model.params(layer, tp) for layer in layers),
        tuple(b * s * model.activation_floats(layer, tp) for layer in layers),
        tuple(b * s * model.output_floats(layer) for layer in layers),
    )


def estimate_profile(model: ModelSpec, gpu: GPUSpec, precision: str = "fp32",
                     efficiency: float = DEFAULT_EFFICIENCY,
                     memory: dict[int, LayerMemory] | None = None) -> Profile:
    """A roofline profile of `model` on `gpu`, tagged as estimated."""
    dtype = DTYPE_BYTES[precision]
    peak = gpu.peak_flops(precision) * efficiency
    tps = model.tp_degrees(gpu.gpus_per_node)
    times = {}
    for tp in tps:
        for mbs in MICROBATCH_SIZES:
            tokens = mbs * model.seq_len
            act_bytes = tokens * model.hidden * dtype
            ar = 2 * (tp - 1) / tp * act_bytes / (gpu.intra_node_gbps * 1e9) if tp > 1 else 0.0
            fwd, bwd = [], []
            for layer in range(model.num_layers):
                kind = model.kind(layer)
                compute = model.forward_flops(layer) * tokens / tp / peak
                if kind == EMBEDDING:
                    compute = act_bytes / (gpu.hbm_gbps * 1e9 * efficiency)
                comm = 2 * ar if kind == BLOCK else (ar if kind == EMBEDDING else 0.0)
                fwd.append(compute + comm + LAUNCH_S)
                bwd.append(2 * compute + comm + LAUNCH_S if kind != EMBEDDING else LAUNCH_S)
            times[(mbs, tp)] = LayerTimes(tuple(fwd), tuple(bwd))
    mem = dict(memory or {})
    for tp in tps:
        mem.setdefault(tp, analytic_memory(model, tp, precision))
    return Profile(
        model=model.name, gpu=gpu.name, num_layers=model.num_layers, precision=precision, source=ESTIMATED,
        times=times, optimizer_s_per_param=optimizer_s_per_param(gpu, efficiency), memory=mem,
        meta={"efficiency": efficiency},
    )


def optimizer_s_per_param(gpu: GPUSpec, efficiency: float = DEFAULT_EFFICIENCY) -> float:
    return ADAM_BYTES_PER_PARAM / (gpu.hbm_gbps * 1e9 * efficiency)


def block_efficiencies(profiles, models: dict[str, ModelSpec], gpus: dict[str, GPUSpec]) -> list[float]:
    """Measured MFU of the blocks of each profile (TP 1, largest microbatch)."""
    out = []
    for p in profiles:
        model, gpu = models.get(p.model), gpus.get(p.gpu)
        sizes = p.microbatch_sizes(tp=1)
        if model is None or gpu is None or not sizes:
            continue
        mbs = sizes[-1]
        lt = p.times[(mbs, 1)]
        block = 1
        seconds = lt.fwd[block] + lt.bwd[block]
        flops = 3 * model.forward_flops(block) * mbs * model.seq_len
        if seconds > 0:
            out.append(flops / seconds / gpu.peak_flops(p.precision))
    return out


def calibrate_efficiency(profiles, models, gpus) -> float:
    effs = block_efficiencies(profiles, models, gpus)
    return statistics.median(effs) if effs else DEFAULT_EFFICIENCY
