"""Fit the estimator's efficiencies to measured profiles.

Each measured layer time (one layer kind, one pass, one microbatch size and
TP degree of one profile) is linear in the coefficients of estimate.py:

    t_measured = T/e_tensor + S/e_simt + M/e_mem + B/e_bb + K*t_kernel + A/e_ar + L*t_ar

with (T, S, M, B, K, A, L) its work terms (estimate.work_terms). We fit
c = (1/e_tensor, 1/e_simt, 1/e_mem, 1/e_bb, t_kernel, 1/e_ar, t_ar) by least
absolute relative error (iteratively reweighted least squares), each row
weighted by the number of the model's layers it stands for (a block's row
for every block, as a pipeline counts them), every efficiency at most 1
(c >= 1), latencies >= 0, plus a weak pull of each coefficient towards a
prior (PRIOR_WEIGHT rows' worth), so that one the profiles say nothing about
(no SIMT GPU among them, no TP > 1) keeps the prior's value.

Each profile's layers are counted with the work of the runtime that measured
them (Sailor's with Megatron's attention, ours with fused attention:
layer_work.py). Only layers whose measured work is the work layer_work.py counts are used:
profiles whose block parameter counts differ from the model description
(a different model under the same name: Sailor's LLAMA-3-8) are skipped,
and so are heads that kept no logits for backward (the measured layer did
not compute them: Sailor's GPT-Neo-2.7 head is its final norm only), and
passes measured under MIN_MEASURED_S (faster than a few kernel launches, they
timed no real work: Sailor's embedding backward, 0-3 us). An fp32 profile on a
GPU with TF32 whose blocks the FP32 units explain better than TF32 ran with
TF32 off (Sailor's A100-40 profiles of OPT-30 and LLAMA-3-8): its GEMMs are
read at the FP32-unit peak, so it calibrates e_simt, not e_tensor.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from planner.profiles.estimate import (DEFAULT_EFFICIENCY, DEFAULT_RUNTIME, DTYPE_BYTES, RUNTIME_WORK, Efficiency,
                                       seconds, tensor_cores, work_terms)
from planner.profiles.head_logits import keeps_logits
from planner.profiles.layer_work import layer_work
from planner.profiles.profile import LayerMemory, Profile
from planner.specs.hardware import GPUSpec
from planner.specs.model import BLOCK, EMBEDDING, FINAL_NORM, HEAD, ModelSpec

# Rules of thumb, fitted to nothing: cuBLAS reaches ~60 % of the tensor-core peak in
# training-sized GEMMs and ~85 % of the FP32 units'; elementwise kernels ~70 % of HBM
# bandwidth; ~10 us per eager-mode kernel; an NCCL ring all-reduce ~50 % of the link's
# bandwidth, ~30 us latency. The prior of leave-one-out validation (bench/estimate_accuracy.py).
PHYSICAL_PRIOR = Efficiency(tensor_gemm=0.6, simt_gemm=0.85, memory=0.7, block_bwd_memory=0.7, kernel_s=1e-5,
                            allreduce=0.5, allreduce_latency_s=3e-5)
PRIOR_WEIGHT = 4.0  # rows' worth of pull towards the prior, per coefficient
IRLS_ROUNDS = 30
MIN_MEASURED_S = 2e-5  # [s]
LOWER = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0])  # c >= 1: no efficiency above 100 %


def coefficients(eff: Efficiency) -> np.ndarray:
    return np.array([1 / eff.tensor_gemm, 1 / eff.simt_gemm, 1 / eff.memory,
                     1 / eff.block_bwd_memory, eff.kernel_s, 1 / eff.allreduce, eff.allreduce_latency_s])


def efficiency(c: np.ndarray) -> Efficiency:
    def frac(x):  # an efficiency from its inverse (>= 1 up to rounding)
        return min(1.0, float(1 / x))

    return Efficiency(frac(c[0]), frac(c[1]), frac(c[2]), frac(c[3]), float(c[4]), frac(c[5]), float(c[6]))


def describes(profile: Profile, model: ModelSpec) -> bool:
    """Whether the profile's measured blocks have the model's parameter counts (1 %)."""
    block = next(layer for layer in range(model.num_layers) if model.kind(layer) == BLOCK)
    for tp, mem in profile.memory.items():
        if len(mem.params) != model.num_layers:
            return False
        expected = model.params(block, tp)
        if abs(mem.params[block] - expected) > 0.01 * expected:
            return False
    return True


def comparable_layers(model: ModelSpec, memory: LayerMemory | None, tp: int, dtype_bytes: int) -> list[int]:
    """One layer of each kind whose measured time is the work layer_work counts."""
    out = []
    for kind in (EMBEDDING, BLOCK, FINAL_NORM, HEAD):
        layer = next((i for i in range(model.num_layers) if model.kind(i) == kind), None)
        if layer is None or (kind == HEAD and not keeps_logits(memory, model, tp, dtype_bytes)):
            continue
        out.append(layer)
    return out


def attention(profile: Profile) -> str:
    """The attention whose work the profile measured: its runtime's (Megatron's where it says none)."""
    return RUNTIME_WORK[profile.runtime or DEFAULT_RUNTIME].attention


def ran_without_tf32(profile: Profile, model: ModelSpec, gpu: GPUSpec, prior: Efficiency) -> bool:
    """Whether an fp32 profile on a GPU with TF32 ran its matmuls on the FP32 units instead: its
    blocks' times are closer (median |log ratio|, prior efficiencies) to that than to TF32."""
    if profile.precision != "fp32" or not tensor_cores(gpu, "fp32") or not gpu.fp32_units_tflops:
        return False
    block = next(layer for layer in range(model.num_layers) if model.kind(layer) == BLOCK)
    misfit: dict[bool, list[float]] = {True: [], False: []}
    for (mbs, tp), lt in profile.times.items():
        works = layer_work(model, block, mbs, tp, DTYPE_BYTES["fp32"], attention(profile))
        for tf32, errors in misfit.items():
            guess = sum(seconds(work_terms(w, gpu, "fp32", tp, tf32), prior) for w in works)
            errors.append(abs(math.log(guess / (lt.fwd[block] + lt.bwd[block]))))
    return statistics.median(misfit[False]) < statistics.median(misfit[True])


def calibration_rows(profiles, models: dict[str, ModelSpec], gpus: dict[str, GPUSpec],
                     prior: Efficiency = DEFAULT_EFFICIENCY):
    """(work terms, measured seconds, layers it stands for) of every comparable measured layer and pass."""
    rows = []
    for p in profiles:
        model, gpu = models.get(p.model), gpus.get(p.gpu)
        if model is None or gpu is None or p.precision not in DTYPE_BYTES or not describes(p, model):
            continue
        tf32 = not ran_without_tf32(p, model, gpu, prior)
        for (mbs, tp), lt in sorted(p.times.items()):
            for layer in comparable_layers(model, p.memory.get(tp), tp, DTYPE_BYTES[p.precision]):
                works = layer_work(model, layer, mbs, tp, DTYPE_BYTES[p.precision], attention(p))
                count = sum(model.kind(i) == model.kind(layer) for i in range(model.num_layers))
                for work, measured in zip(works, (lt.fwd[layer], lt.bwd[layer])):
                    if measured >= MIN_MEASURED_S:
                        rows.append((work_terms(work, gpu, p.precision, tp, tf32), measured, count))
    return rows


def _bounded_lstsq(a: np.ndarray, y: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """min |a x - y|^2 subject to x >= lower (active set: pin violators to their bound)."""
    pinned = np.zeros(a.shape[1], dtype=bool)
    x = lower.copy()
    for _ in range(a.shape[1] + 1):
        free = ~pinned
        x[free] = np.linalg.lstsq(a[:, free], y - a[:, pinned] @ lower[pinned], rcond=None)[0]
        x[pinned] = lower[pinned]
        low = free & (x < lower)
        if not low.any():
            return x
        pinned |= low
    return np.maximum(x, lower)


def fit_efficiency(profiles, models: dict[str, ModelSpec], gpus: dict[str, GPUSpec],
                   prior: Efficiency = DEFAULT_EFFICIENCY) -> Efficiency:
    """The efficiencies that best explain the measured profiles (the prior where they say nothing)."""
    rows = calibration_rows(profiles, models, gpus, prior)
    if not rows:
        return prior
    c0 = coefficients(prior)
    # Unknowns x = c / c0 (all near 1); each row, divided by its measured time, predicts 1.
    a = np.array([r[0] for r in rows]) * c0 / np.array([r[1] for r in rows])[:, None]
    weight = np.array([r[2] for r in rows], dtype=float)  # a row counts once per layer it stands for
    pull = np.sqrt(PRIOR_WEIGHT) * np.eye(len(c0))
    x = np.ones(len(c0))
    for _ in range(IRLS_ROUNDS):
        w = np.sqrt(weight / np.maximum(np.abs(a @ x - 1), 0.02))  # |r| = r^2 / |r|: least absolute deviations
        x = _bounded_lstsq(np.vstack([a * w[:, None], pull]), np.concatenate([w, pull.diagonal()]), LOWER / c0)
    return efficiency(x * c0)
