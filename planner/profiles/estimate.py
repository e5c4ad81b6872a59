"""Analytical profiles for GPUs (or models) that were never measured.

A layer's time on a GPU is the sum of the times of its kinds of work
(layer_work.py counts them op by op), each at a spec-sheet rate times an
efficiency:

    t = F / (peak * e_gemm)                  GEMMs                                 [s]
      + Q / (hbm * e_mem)                    memory-bound kernels                  [s]
      + Q_bb / (hbm * e_bb)                  the same in a block's backward        [s]
      + K * t_kernel                         kernel launches (eager PyTorch)       [s]
      + 2(t-1)/t * C / (intra * e_ar)        TP all-reduce payload (ring)          [s]
      + R * t_ar                             TP all-reduce latency                 [s]

F [FLOP], Q, Q_bb, C [B], K and R from layer_work; peak [FLOP/s] is the
GPU's matmul peak for the precision, hbm and intra [B/s] its memory and
intra-node bandwidths (planner.specs.hardware). e_gemm depends on the unit
that runs the GEMMs: tensor cores for 16-bit precisions, and for fp32 on
GPUs with TF32 (Ampere and later: their TF32 rate is half their 16-bit
rate) (e_tensor); the FP32 units for fp32 on V100 and Turing (e_simt). On
Hopper, fp32 backward GEMMs reach at most 2/3 of the tensor peak (see
WGMMA_GPUS). The efficiencies (an `Efficiency`) are fitted to the measured
profiles at hand (calibrate.py); with none, DEFAULT_EFFICIENCY, fitted the
same way to all of Sailor's published profiles.

Optimizer step (Adam, fp32 states): every parameter reads and writes
ADAM_BYTES_PER_PARAM bytes of weights, gradients and moments:
ADAM_BYTES_PER_PARAM / (hbm * e_mem) seconds per parameter.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.profiles.layer_work import Work, layer_work
from planner.profiles.profile import ESTIMATED, LayerMemory, LayerTimes, Profile
from planner.specs.hardware import GPUSpec
from planner.specs.model import ModelSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_BYTES_PER_PARAM = 28  # read w, g, m, v (16 B); write w, m, v (12 B), fp32
MICROBATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Efficiency:
    """What fraction of its spec sheet a GPU reaches, per kind of work (see the module doc)."""

    tensor_gemm: float  # of the tensor-core matmul peak (TF32 for fp32, or 16-bit)
    simt_gemm: float  # of the FP32-unit peak (fp32 on GPUs without TF32, or with TF32 off)
    memory: float  # of the HBM bandwidth, memory-bound kernels
    block_bwd_memory: float  # the same in a block's backward (autograd's chain of small kernels)
    kernel_s: float  # [s] per kernel launch
    allreduce: float  # of the intra-node bandwidth, TP all-reduce (ring bus bandwidth)
    allreduce_latency_s: float  # [s] per TP all-reduce

    def to_dict(self) -> dict:
        return asdict(self)


# calibrate.fit_efficiency on all of Sailor's published profiles (17 model x GPU
# pairs), rounded; `python bench/estimate_accuracy.py --fit` prints it.
DEFAULT_EFFICIENCY = Efficiency(tensor_gemm=0.72, simt_gemm=0.97, memory=0.84, block_bwd_memory=0.44,
                                kernel_s=1.4e-5, allreduce=0.64, allreduce_latency_s=8.8e-5)


# Hopper's full tensor rate needs its wgmma instruction, which reads TF32 operands only
# K-major (PTX ISA: the transposing forms are for 16-bit types). Backward GEMMs
# (dX = dY W, dW = dY^T X) have an MN-major operand, so in fp32 they take the older
# mma.sync path (or transpose first), and mma.sync "can only reach about 2/3 of the peak
# throughput of the Hopper GPU Tensor Cores" (Shah et al., FlashAttention-3, 2024).
WGMMA_GPUS = frozenset({"H100-80", "H200", "GH200-96"})
MMA_SYNC_FRACTION = 2 / 3


def tensor_cores(gpu: GPUSpec, precision: str) -> bool:
    """Whether `precision`'s matmuls run on tensor cores: 16-bit always; fp32 where the
    catalog's fp32 peak is TF32, i.e. half the 16-bit peak (Ampere and later)."""
    return precision != "fp32" or 2 * gpu.fp32_tflops >= 0.99 * gpu.bf16_tflops


def work_terms(work: Work, gpu: GPUSpec, precision: str, tp: int, tf32: bool = True) -> tuple[float, ...]:
    """The terms of the module doc before their efficiencies: (tensor GEMM s, SIMT GEMM s,
    memory s, block-backward memory s, kernels, all-reduce ring s, all-reduces). tf32=False:
    fp32 matmuls run on the FP32 units although the GPU has TF32 (PyTorch's default since 1.12)."""
    tensor = tensor_cores(gpu, precision) and (tf32 or precision != "fp32")
    peak = gpu.peak_flops(precision) if tensor or not gpu.fp32_units_tflops else 1e12 * gpu.fp32_units_tflops
    gemm = work.gemm_flops / peak
    if tensor and work.backward and precision == "fp32" and gpu.name in WGMMA_GPUS:
        gemm /= MMA_SYNC_FRACTION
    ring = 2 * (tp - 1) / tp * work.allreduce_bytes / (gpu.intra_node_gbps * 1e9) if tp > 1 else 0.0
    hbm = gpu.hbm_gbps * 1e9
    return (gemm if tensor else 0.0, 0.0 if tensor else gemm, work.bytes / hbm, work.block_bwd_bytes / hbm,
            work.kernels, ring, work.allreduces)


def seconds(terms: tuple[float, ...], eff: Efficiency) -> float:
    tensor, simt, mem, block_bwd, kernels, ring, ars = terms
    return (tensor / eff.tensor_gemm + simt / eff.simt_gemm + mem / eff.memory + block_bwd / eff.block_bwd_memory
            + kernels * eff.kernel_s + ring / eff.allreduce + ars * eff.allreduce_latency_s)


def layer_seconds(model: ModelSpec, layer: int, mbs: int, tp: int, gpu: GPUSpec, precision: str,
                  eff: Efficiency) -> tuple[float, float]:
    """(forward, backward) seconds of one layer for one microbatch."""
    fwd, bwd = layer_work(model, layer, mbs, tp, DTYPE_BYTES[precision])
    return (seconds(work_terms(fwd, gpu, precision, tp), eff), seconds(work_terms(bwd, gpu, precision, tp), eff))


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
                     efficiency: Efficiency = DEFAULT_EFFICIENCY,
                     memory: dict[int, LayerMemory] | None = None) -> Profile:
    """An analytical profile of `model` on `gpu`, tagged as estimated."""
    tps = model.tp_degrees(gpu.gpus_per_node)
    # one layer of each kind (all blocks do the same work)
    first = {model.kind(layer): layer for layer in reversed(range(model.num_layers))}
    times = {}
    for tp in tps:
        for mbs in MICROBATCH_SIZES:
            per_kind = {kind: layer_seconds(model, layer, mbs, tp, gpu, precision, efficiency)
                        for kind, layer in first.items()}
            rows = [per_kind[model.kind(layer)] for layer in range(model.num_layers)]
            times[(mbs, tp)] = LayerTimes(tuple(f for f, _ in rows), tuple(b for _, b in rows))
    mem = dict(memory or {})
    analytic = [tp for tp in tps if tp not in mem]  # no measured memory facts at this TP
    for tp in analytic:
        mem[tp] = analytic_memory(model, tp, precision)
    return Profile(
        model=model.name, gpu=gpu.name, num_layers=model.num_layers, precision=precision, source=ESTIMATED,
        times=times, optimizer_s_per_param=optimizer_s_per_param(gpu, efficiency), memory=mem,
        meta={"efficiency": efficiency.to_dict(), "estimated_memory_tps": analytic},
    )


def optimizer_s_per_param(gpu: GPUSpec, efficiency: Efficiency = DEFAULT_EFFICIENCY) -> float:
    return ADAM_BYTES_PER_PARAM / (gpu.hbm_gbps * 1e9 * efficiency.memory)


def calibrate_efficiency(profiles, models: dict[str, ModelSpec], gpus: dict[str, GPUSpec]) -> Efficiency:
    """The efficiencies that best explain the measured `profiles` (DEFAULT_EFFICIENCY where they say nothing)."""
    from planner.profiles.calibrate import fit_efficiency

    return fit_efficiency(profiles, models, gpus)
