"""Measured heads that never computed the logits, completed with them.

Sailor's GPT-Neo-2.7 profiles time a head that is the final norm alone: it kept
2h values per token for backward and none per vocabulary entry
(keeps_logits), so the logit GEMM against the tied word embedding and
the cross entropy ran in no measured layer. A training run computes both on its
last stage. Per pass (forward, backward), for a microbatch of b samples at TP t:

    t_head'  = t_head + t_logits
    t_logits = est_logits(b, t) * t_block(b, t) / est_block(b, t)                [s]

est_logits: the analytical work of the head without its norm (layer_work.py: the
b*s x h x V/t GEMM, the logit copies and the fp32 vocabulary-parallel cross
entropy) at the estimator's default efficiencies; t_block / est_block, this GPU's
measured block over its estimate at the same b and t, brings the estimate to the
speed the GPU showed on the same kinds of work (GEMMs and memory-bound kernels).
The head also keeps the logits and their softmax for backward:

    A_head'  = A_head + dtype_bytes * s * 2 V/t                        [B per sample]

(model.activation_floats; V the vocabulary padded for TP t). For GPT-Neo-2.7 at
TP 4 that is 206 MB per sample, about what a block keeps; on GH200 at b = 8 the
completed head takes 0.9 of a block's time. On OPT-350's heads, which were
measured with their logits, the rule is within 20 % (median |error| over every
GPU, b and t; tests/planner/test_head_logits.py).
"""
from __future__ import annotations

from dataclasses import replace

from planner.profiles.estimate import DEFAULT_EFFICIENCY, DTYPE_BYTES, layer_seconds
from planner.profiles.profile import LayerMemory, LayerTimes, Profile
from planner.specs.hardware import GPUSpec
from planner.specs.model import BLOCK, HEAD, ModelSpec


def keeps_logits(memory: LayerMemory | None, model: ModelSpec, tp: int, dtype_bytes: int) -> bool:
    """Whether the measured head kept its logits for backward (a value per vocabulary entry and
    token): if not, it did not compute them."""
    if memory is None:
        return True
    return memory.activation_bytes[-1] / model.seq_len >= dtype_bytes * model.padded_vocab(tp) / tp


def lacks_logits(memory: dict[int, LayerMemory], model: ModelSpec, precision: str) -> bool:
    """Whether the measured head (at every TP degree with memory facts) kept no logits."""
    if model.kind(model.num_layers - 1) != HEAD or precision not in DTYPE_BYTES or not memory:
        return False
    return not any(keeps_logits(m, model, tp, DTYPE_BYTES[precision]) for tp, m in memory.items())


def with_logit_memory(memory: dict[int, LayerMemory], model: ModelSpec, precision: str) -> dict[int, LayerMemory]:
    """Memory facts whose head also keeps the logits and their softmax (module doc)."""
    out = {}
    for tp, m in memory.items():
        extra = DTYPE_BYTES[precision] * model.seq_len * 2.0 * model.padded_vocab(tp) / tp  # [B per sample]
        acts = (*m.activation_bytes[:-1], m.activation_bytes[-1] + extra)
        out[tp] = LayerMemory(m.params, acts, m.output_bytes, m.workspace_bytes)
    return out


def with_logits(profile: Profile, model: ModelSpec, gpu: GPUSpec) -> Profile:
    """`profile` with the logit GEMM and the loss added to its head, if its head lacks them."""
    if not lacks_logits(profile.memory, model, profile.precision):
        return profile
    head = model.num_layers - 1
    block = next(layer for layer in range(model.num_layers) if model.kind(layer) == BLOCK)
    logits_only = replace(model, separate_final_norm=True)  # the same head without its norm
    times = {}
    for (mbs, tp), lt in profile.times.items():
        est_block = layer_seconds(model, block, mbs, tp, gpu, profile.precision, DEFAULT_EFFICIENCY)
        est_logits = layer_seconds(logits_only, logits_only.num_layers - 1, mbs, tp, gpu, profile.precision,
                                   DEFAULT_EFFICIENCY)
        measured_block = (lt.fwd[block], lt.bwd[block])
        add = [e * m / b for e, m, b in zip(est_logits, measured_block, est_block)]  # [s] forward, backward
        times[(mbs, tp)] = LayerTimes((*lt.fwd[:head], lt.fwd[head] + add[0]), (*lt.bwd[:head], lt.bwd[head] + add[1]))
    return replace(profile, times=times, memory=with_logit_memory(profile.memory, model, profile.precision),
                   meta={**profile.meta, "head_logits": "estimated"})
