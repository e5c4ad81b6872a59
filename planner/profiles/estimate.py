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
the runtime's optimizer bytes (RuntimeWork) of weights, gradients, moments
and temporaries: bytes / (hbm * e_mem) seconds per parameter.

The work is the work of the framework that runs the layer (RUNTIME_WORK, keyed
like planner.simulator.runtime_model.RUNTIMES): Sailor's measured profiles are
Megatron-DeepSpeed's, our own (`sailor profile`) and our plans sailor_ext's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.profiles.layer_work import Work, layer_work
from planner.profiles.profile import ESTIMATED, LayerMemory, LayerTimes, Profile
from planner.specs.hardware import GPUSpec
from planner.specs.model import BLOCK, ModelSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_BYTES_PER_PARAM = 28  # read w, g, m, v (16 B); write w, m, v (12 B), fp32
MICROBATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class RuntimeWork:
    """What the framework that runs a plan does differently, as far as the estimator counts work."""

    attention: str  # layer_work.ATTENTION
    optimizer_bytes_fp32: float  # [B/parameter] moved by one optimizer step, fp32 training
    optimizer_bytes_16bit: float  # the same with 16-bit weights beside fp32 masters (bf16, fp16)

    def optimizer_bytes(self, precision: str) -> float:
        return self.optimizer_bytes_fp32 if precision == "fp32" else self.optimizer_bytes_16bit


RUNTIME_WORK = {
    # Megatron-DeepSpeed: Megatron's core attention; Apex's fused Adam, one pass over w, g, m, v.
    "megatron-deepspeed": RuntimeWork("eager", ADAM_BYTES_PER_PARAM, ADAM_BYTES_PER_PARAM),
    # sailor_ext: scaled_dot_product_attention; its optimizer step (sailor_ext/optimizer.py) is a
    # chain of foreach kernels over fp32 tensors, each a pass over memory [B/parameter]: the
    # global norm reads g (4), the clip scales g (8), then torch's foreach AdamW: decay w (8),
    # m.lerp_(g) (12), v *= beta2 (8), v.addcmul_(g, g) (12), sqrt(v) into a new tensor (8),
    # divided by the bias correction (8), + eps (8), w.addcdiv_(m, denominator) (16): 92;
    # with 16-bit weights the masters are copied into them after (read 4, write 2): 98.
    "sailor": RuntimeWork("sdpa", 92.0, 98.0),
}
DEFAULT_RUNTIME = "megatron-deepspeed"  # the runtime of Sailor's measured profiles


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
                  eff: Efficiency, runtime: str = DEFAULT_RUNTIME) -> tuple[float, float]:
    """(forward, backward) seconds of one layer for one microbatch, run by `runtime`."""
    fwd, bwd = layer_work(model, layer, mbs, tp, DTYPE_BYTES[precision], RUNTIME_WORK[runtime].attention)
    return (seconds(work_terms(fwd, gpu, precision, tp), eff), seconds(work_terms(bwd, gpu, precision, tp), eff))


def activation_floats(model: ModelSpec, layer: int, tp: int, runtime: str = DEFAULT_RUNTIME,
                      precision: str = "bf16") -> float:
    """Floats per token that the forward keeps for backward, one sample (values in the compute dtype).

    Megatron-DeepSpeed: ModelSpec.activation_floats (its softmax probabilities, heads * s per
    token, included). sailor_ext's block on CUDA (the kernel fusions on), for TP t:

        norms          2h per LayerNorm (input, output), 3h per RMSNorm (input, normalised,
                       output), two per block (one when shared: Cohere); sandwich norms (Gemma
                       2, 3) add two whose output goes into an add: input and normalised, 2h
                       each (h for a LayerNorm); without pre-norms (OLMo 2) the sublayers'
                       inputs, h each
        attention      Q, K and V as the fused attention saves them, (q + 2kv)/t, and its
                       output q/t (also the projection's input)
        MLP            the first linear's output f_in/t and the activation's output f/t
                       (a fused SwiGLU recomputes the rest); an unfused gated MLP (GeGLU)
                       keeps the activation's output, megatron's `up + 0` and their product, 3f/t;
                       xIELU (Apertus) keeps four more products, 4f/t, and its x > 0 mask, f/t bytes
        q/k norms      (Qwen3) their inputs and normalised values, 2(q + kv)/t (counted, not
                       measured)
        attention cap  (Gemma 2) no fused kernel: K and V expanded to every query head, 2q/t
                       in place of 2kv/t, the tanh's output S/t and the softmax's, S/t in
                       fp32 (its fp32 output, 2 S/t, and the probabilities cast back, S/t, in
                       16-bit), S = heads * s
        sinks          (gpt-oss) fused too, with q and k wider by the sink's dimension and padding,
                       (q + kv)/t * sink_dims / head_dim more
        latent         (DeepSeek) Q and K each q/t wide, V and the output c/t (c = heads * v_head_dim);
                       replicated, the latents' norms as the block's, 3(r_q + r_kv), and the shared
                       rotary key beside the kv latent, rope_head_dim
    A dense block among experts (DeepSeek's first) keeps what a dense model's block of its width keeps; a Gated
    DeltaNet block (Qwen3.5) keeps ModelSpec.linear_attention_floats in place of the attention's.

    The fused attention keeps no probabilities: one log-sum-exp per head and token (not counted,
    1/s of them). Measured on one H100 (bf16, bench/results/h100-2026-11-28): OPT-350m and
    GPT-Neo-2.7 16.0h per token, LLaMA-3-8 22.1h, as counted (16h, 16h, 22h). On CPU, with
    rotary, the QKV output stays beside the rotated Q and K: (q + kv)/t more. Gemma 2's block
    (fp32, CPU, autograd's saved tensors; tests/runtime/test_units.py) as counted, within the
    rotary angles and the mask, which do not grow with the batch."""
    if RUNTIME_WORK[runtime].attention == "eager" or model.kind(layer) != BLOCK:
        return model.activation_floats(layer, tp)
    if model.dense(layer - 1):
        model = model.dense_view
    linear = model.linear(layer - 1)
    pre = 3 if model.rms_norm else 2
    before = ((1 if model.shared_norm else 2) if model.input_norms else 0)  # norms before the sublayers; sandwich after
    inputs = 0 if model.input_norms else 2  # without pre-norms the sublayers' first linears keep their inputs
    norms = (before * pre + (model.block_norms - before) * (pre - 1) + inputs) * model.hidden
    kv = model.q_dim if model.attn_softcap else model.kv_dim
    attention = (model.q_dim + 2 * kv) + model.q_dim
    if model.latent:
        attention = 2 * (model.q_dim + model.context_dim)
        norms += pre * (model.q_lora_rank + model.kv_lora_rank) + model.rope_head_dim
    if model.attention_sinks:  # q and k widened by the sink's dimension and padding (sailor_ext.attention)
        attention += (model.q_dim + model.kv_dim) * model.sink_dims / model.head_dim
    if model.qk_norm or model.qk_l2_norm and model.rotary(layer - 1):  # the q and k norms' inputs and normalised
        # values (rotary keeps none of its input)
        attention += 2 * (model.q_dim + model.kv_dim)
    if model.attn_softcap:
        attention += (2 if DTYPE_BYTES[precision] == 4 else 4) * model.heads * model.seq_len
    if linear:  # a Gated DeltaNet instead (its own count is per TP rank)
        attention = model.linear_attention_floats(tp, DTYPE_BYTES[precision]) * tp
    if model.experts:
        return norms + attention / tp + model.moe_activation_floats(tp, DTYPE_BYTES[precision])
    fused = model.gated_mlp and model.activation == "silu"
    mlp = model._mlp_in() + (3 if model.gated_mlp and not fused else 1) * model.ffn_hidden
    if model.activation == "xielu":
        mlp += (4 + 1 / DTYPE_BYTES[precision]) * model.ffn_hidden
    return norms + (attention + mlp) / tp


def analytic_memory(model: ModelSpec, tp: int, precision: str, runtime: str = DEFAULT_RUNTIME) -> LayerMemory:
    b = DTYPE_BYTES[precision]
    s = model.seq_len
    layers = range(model.num_layers)
    return LayerMemory(
        tuple(model.params(layer, tp) for layer in layers),
        tuple(b * s * activation_floats(model, layer, tp, runtime, precision) for layer in layers),
        tuple(b * s * model.output_floats(layer) for layer in layers),
    )


def estimate_profile(model: ModelSpec, gpu: GPUSpec, precision: str = "fp32",
                     efficiency: Efficiency = DEFAULT_EFFICIENCY,
                     memory: dict[int, LayerMemory] | None = None, runtime: str = DEFAULT_RUNTIME) -> Profile:
    """An analytical profile of `model` on `gpu` as `runtime` runs it, tagged as estimated."""
    tps = model.tp_degrees(gpu.gpus_per_node)
    times = {}
    for tp in tps:
        for mbs in MICROBATCH_SIZES:
            rows = per_layer(model, (runtime,),
                             lambda layer: layer_seconds(model, layer, mbs, tp, gpu, precision, efficiency, runtime))
            times[(mbs, tp)] = LayerTimes(tuple(f for f, _ in rows), tuple(b for _, b in rows))
    mem = dict(memory or {})
    analytic = [tp for tp in tps if tp not in mem]  # no measured memory facts at this TP
    for tp in analytic:
        mem[tp] = analytic_memory(model, tp, precision, runtime)
    return Profile(
        model=model.name, gpu=gpu.name, num_layers=model.num_layers, precision=precision, source=ESTIMATED,
        times=times, optimizer_s_per_param=optimizer_s_per_param(gpu, efficiency, runtime, precision), memory=mem,
        meta={"efficiency": efficiency.to_dict(), "estimated_memory_tps": analytic, "runtime": runtime},
    )


def same_work(model: ModelSpec, layer: int, runtime: str = DEFAULT_RUNTIME) -> tuple:
    """Layers with equal keys do the same work: one of each kind, a block without rotary positions
    apart from one with, a dense block among experts apart from a sparse one, and under fused attention a
    windowed (or chunked) block apart from a causal one (eager attention, and capped attention, compute the whole
    square either way); a Gated DeltaNet block has its own key."""
    kind = model.kind(layer)
    if kind != BLOCK:
        return (kind,)
    if model.linear(layer - 1):
        return (kind, "linear", model.dense(layer - 1))
    rotary = model.rotary(layer - 1)
    dense = model.dense(layer - 1)
    if RUNTIME_WORK[runtime].attention == "eager" or model.attn_softcap:
        return (kind, rotary, dense)
    return (kind, rotary, dense, 0 < model.window(layer - 1) < model.seq_len or bool(model.chunk(layer - 1)))


def per_layer(model: ModelSpec, runtimes: tuple[str, ...], fn) -> list:
    """fn(layer) for every layer, computed once per kind of work (same_work under each of `runtimes`)."""
    done: dict[tuple, object] = {}
    out = []
    for layer in range(model.num_layers):
        key = tuple(same_work(model, layer, rt) for rt in runtimes)
        if key not in done:
            done[key] = fn(layer)
        out.append(done[key])
    return out


def optimizer_s_per_param(gpu: GPUSpec, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                          runtime: str = DEFAULT_RUNTIME, precision: str = "fp32") -> float:
    return RUNTIME_WORK[runtime].optimizer_bytes(precision) / (gpu.hbm_gbps * 1e9 * efficiency.memory)


def calibrate_efficiency(profiles, models: dict[str, ModelSpec], gpus: dict[str, GPUSpec]) -> Efficiency:
    """The efficiencies that best explain the measured `profiles` (DEFAULT_EFFICIENCY where they say nothing)."""
    from planner.profiles.calibrate import fit_efficiency

    return fit_efficiency(profiles, models, gpus)
