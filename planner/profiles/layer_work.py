"""What one layer asks of a GPU: FLOPs, bytes moved, kernel launches, TP all-reduces.

The estimator (estimate.py) turns this work into seconds with a GPU's spec
sheet and a few efficiencies; this module is only the model's side, counted
op by op the way Megatron(-DeepSpeed) runs a decoder layer in eager PyTorch,
for one microbatch of b samples of s tokens on one GPU of a TP group of t.
Dropout is 0 (our runtime's setting; Sailor's llm_info keeps no dropout
masks, and PyTorch's dropout at p = 0 returns its input untouched).

Per token, with h the hidden size, q = heads*head_dim, kv the K (and V)
width, f the FFN width, f_in = f (2f for SwiGLU), S = heads*s the attention
scores of one token (all s keys: Megatron computes the whole s x s matrix
and masks it, with or without a sliding window):

  GEMM FLOPs, forward     2(h(q+2kv) + qh + h f_in + f h)/t + 4 s q/t     [FLOP/token]
                          (the four linear layers; QK^T and AV)
  GEMM FLOPs, backward    2x forward (input and weight gradients)
  head                    2 h V/t (+ 2 e h with a projection) forward, 2x backward

Memory traffic in values per token (x dtype bytes), reads + writes, of the
memory-bound kernels: elementwise ops, reductions, copies, the batched
attention GEMMs (head_dim deep: they stream the s x s scores), and the
operands of the linear layers:

  block fwd  norms 2 x 2h, bias + residual adds 2 x 3h, linear I/O 4h + (q+2kv + q + f_in + f)/t,
             scores: QK^T writes S, softmax 2S, AV reads S -> 4 S/t with Megatron's fused
             scale-mask-softmax (16-bit inputs only), + masked_fill 2S -> 7 S/t in fp32,
             GELU 2f/t (SwiGLU 3f/t), context transpose copy 2q/t, rotary 6(q+kv)/t
             (x the share of each head it rotates)
  block bwd  norms 2 x 3h, residual gradient adds 2 x 3h, linear I/O 2x forward,
             scores: AV writes dP and reads P 2S, softmax 3S, QK^T reads dS twice 2S
             -> 7 S/t fused, + masked_fill 2S -> 9 S/t in fp32,
             GELU 3f/t (SwiGLU 5f/t), transpose 2q/t, rotary 6(q+kv)/t
  head fwd   norm 2h, logits written V/t and copied to [b, s, V] 2V/t, vocab-parallel
             cross entropy (max, subtract, exp, sum, divide) 8 V/t in 4-byte floats
  head bwd   cross-entropy gradient 2 V/t (4-byte), copy back 2V/t, logit-gradient GEMM I/O
             2 V/t + 2h, norm 3h
  embedding  fwd: word gather 2h, position gather 2h + add 3h, [b,s,h] -> [s,b,h] copy 2h
             (+ 2h zeroing other ranks' tokens at TP > 1); bwd: scatter-adds 4h (+ 2h positions)
  RMSNorm    unfused in Megatron-DeepSpeed (pow, mean, rsqrt, two multiplies): 7h fwd, 14h bwd
  q/k norms  (Qwen3) two more norms over q and k: 7(q+kv)/t fwd, 14(q+kv)/t bwd as RMSNorms
  Granite    the residual multiplier: one multiply per sublayer, 2 x 2h fwd and bwd; the logits
             divisor: 2 V/t fwd and bwd; one kernel each
  Gemma      sandwich norms: two more norms over h per block; scaled embeddings (Granite's
             too): one multiply, 2h fwd and bwd; soft caps (divide, tanh, multiply): 6 S/t fwd,
             7 S/t bwd on the scores (tanh's backward reads its output), 6 V/t and 7 V/t on the
             logits, 3 kernels each way. Our runtime computes capped scores in full (no fused kernel caps them),
             so a block with an attention cap is counted as eager attention under "sdpa" too
  gpt-oss    attention sinks as one more key of a fused kernel (sailor_ext.attention): q, k and v
             copied once more, 2(q + 2kv)/t fwd and bwd, 6 and 3 kernels; the kernel takes an
             explicit mask, so under "sdpa" it computes the whole square, QK^T over heads wider by
             sink_dims; the clamped GLU: 10 f/t fwd, 20 f/t bwd per expert a token passes
             through, 5 and 10 kernels per expert

  DeepSeek   latent attention: the down-projections read h twice and write the q and kv latents
             and the shared rotary key (r_q + r_kv + r, read again by the up-projections), whose
             outputs are q/t and [k; v] per head/t; two norms over the latents, replicated; q, k
             and v put together, (4q + 2c)/t each way, 3 kernels; rotary on r dimensions per head
             and the shared key; V and the context c = heads * v_head_dim wide. Its router: the
             score bias and the group choice, 3 x 4E/d forward; its dense blocks count as a dense
             model's

plus, once per microbatch, every weight read (fwd), and read with its
gradient accumulated (bwd): params/t x dtype bytes [B] (x2 backward).

Kernels per pass are counted the same way (block: 14 forward, 30 backward;
+1/+3 unfused softmax, +6/+12 rotary, +2/+4 SwiGLU, +5/+10 per RMSNorm).
TP all-reduces (b*s*h values each): a block's two row-parallel outputs forward
and two column-parallel input gradients backward; the embedding's output
forward (vocab-parallel); the head's input gradient backward, plus three
b*s-value reductions (max, sum, target logit) forward.

Attention, by runtime (ATTENTION). The counts above are Megatron's core
attention ("eager": the s x s scores written, soft-maxed and read; Sailor's
Megatron-DeepSpeed). Our runtime (sailor_ext/attention.py) calls PyTorch's
scaled_dot_product_attention ("sdpa"), whose kernels keep the scores on chip:

  causal block (no window)  a flash kernel: only the tiles on or below the diagonal,
                            QK^T and AV forward 4 s q/t x 1/2 [FLOP/token]; backward
                            recomputes QK^T (five GEMMs to the forward's two: 2.5x,
                            Dao 2023, FlashAttention-2)
  windowed block            the memory-efficient kernel with the mask: the whole
                            square, 4 s q/t forward, 2.5x that backward
  traffic                   no scores; the kernel reads Q, K, V and writes O forward
                            (2q + 2kv)/t, reads Q, K, V, O, dO and writes dQ, dK, dV
                            backward (4q + 4kv)/t; the broadcast [s, s] mask of a
                            windowed block stays in L2 and is not counted
  kernels                   one forward, three backward, for Megatron's three and five
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.specs.model import BLOCK, DELTA_CHUNK, EMBEDDING, FINAL_NORM, HEAD, ModelSpec

CE_BYTES = 4  # Megatron's cross entropy upcasts the logits to fp32
ATTENTION = ("eager", "sdpa")  # Megatron's core attention; PyTorch's fused kernels (module doc)
FLASH_BACKWARD = 2.5  # attention GEMM FLOPs of a fused kernel's backward per forward one


@dataclass(frozen=True)
class Work:
    """One pass (forward or backward) of one layer for one microbatch on one GPU."""

    gemm_flops: float = 0.0  # [FLOP] matmuls that can run at the GEMM peak
    bytes: float = 0.0  # [B] memory traffic of the memory-bound kernels
    block_bwd_bytes: float = 0.0  # [B] the same in a block's backward (its own efficiency: estimate.py)
    kernels: float = 0.0  # kernel launches
    allreduce_bytes: float = 0.0  # [B] payload of the TP all-reduces, summed over them
    allreduces: float = 0.0  # TP all-reduces (each costs a latency)
    backward: bool = False


def _norm(model: ModelSpec) -> tuple[float, float, int, int]:
    """One norm: (fwd, bwd) values moved per token and hidden unit, (fwd, bwd) kernels."""
    return (7.0, 14.0, 6, 12) if model.rms_norm else (2.0, 3.0, 1, 2)


def layer_work(model: ModelSpec, layer: int, mbs: int, tp: int, dtype_bytes: int,
               attention: str = "eager") -> tuple[Work, Work]:
    """(forward, backward) work of `layer` for a microbatch of `mbs` samples at TP `tp`, with
    the attention of the runtime that runs it (ATTENTION)."""
    kind = model.kind(layer)
    n, d, h, t = mbs * model.seq_len, dtype_bytes, model.hidden, tp  # tokens, B/value, width, TP
    comm = n * h * d if t > 1 else 0.0  # [B] one activation all-reduce
    ar = 1.0 if t > 1 else 0.0
    norm_f, norm_b, norm_kf, norm_kb = _norm(model)
    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; one of {ATTENTION}")
    if kind == BLOCK:
        if model.dense(layer - 1):  # DeepSeek's dense blocks: a dense model's block of their width
            model = model.dense_view
        weights = model.params(layer, tp) * d  # [B]
        q, kv, f, f_in = model.q_dim, model.kv_dim, model.ffn_hidden, model._mlp_in()
        c = model.context_dim  # V's and the context's width (q for all but latent attention)
        scores = model.heads * model.seq_len  # S
        fused = d < 4  # Megatron's fused softmax takes 16-bit inputs only; fp32 runs PyTorch's ops
        rotary = model.rotary(layer - 1)
        rope = 6.0 * (q + kv) / t * model.rotary_fraction if rotary else 0.0
        gated, mlps = model.gated_mlp, model.active_mlps  # mlps: the MLPs (experts) a token passes through
        linear_io = 4 * h + (q + 2 * kv + q + mlps * (f_in + f)) / t
        latent_f = latent_b = 0.0  # latent attention's own traffic (below)
        if model.latent:
            r_q, r_kv, r = model.q_lora_rank, model.kv_lora_rank, model.rope_head_dim
            rope = 6.0 * (model.heads * r / t + r) if rotary else 0.0
            kv_up = model.heads * (model.head_dim - r + model.v_head_dim)
            # the down-projections read h twice, write the latents and the shared rotary key (read again by the
            # up-projections); the up-projections write q and [k; v] per head, the output projection reads c
            linear_io = 5 * h + 2 * (r_q + r_kv + r) + (q + kv_up + c + mlps * (f_in + f)) / t
            copies = (4 * q + 2 * c) / t  # q, k and v put together (and their gradients taken apart)
            latent_f, latent_b = norm_f * (r_q + r_kv) + copies, norm_b * (r_q + r_kv) + copies  # with two norms
        mixer_f = (4 if fused else 7) * scores / t + 2 * c / t + rope + latent_f  # the attention's own traffic
        mixer_b = (7 if fused else 9) * scores / t + 2 * c / t + rope + latent_b
        mixer_kf, mixer_kb = (0 if fused else 1) + (6 if rotary else 0), (0 if fused else 3) + (12 if rotary else 0)
        linear = model.linear(layer - 1)
        if linear:
            # Gated DeltaNet: the projections write [q; k; v], z, b and a and the output projection reads v; what
            # the block keeps (ModelSpec.linear_attention_floats, per rank) is written once forward and read once
            # backward, beside its gradient written and read; about 40 kernels a pass plus 8 per chunk of the
            # recurrence (its matmuls and the state's update), twice as many backward
            kept = model.linear_attention_floats(t, d)
            linear_io = 4 * h + (2 * model.linear_k_dim + 2 * model.linear_v_dim + 2 * model.linear_value_heads
                                 + mlps * (f_in + f)) / t
            chunks = math.ceil(model.seq_len / DELTA_CHUNK)
            mixer_f, mixer_b, mixer_kf, mixer_kb = 2 * kept, 3 * kept, 40 + 8 * chunks, 80 + 16 * chunks
        norms = model.block_norms
        squared = mlps * 2 * f / t if model.activation == "relu2" else 0.0  # relu then square: one more f in, f out
        fwd = (norms * norm_f * h + 2 * 3 * h + linear_io + mixer_f + mlps * (3 if gated else 2) * f / t + squared)
        bwd = (norms * norm_b * h + 2 * 3 * h + 2 * linear_io + mixer_b + mlps * (5 if gated else 3) * f / t + squared)
        k_f = 14 + norms * norm_kf - 2 + mixer_kf + 2 * gated + bool(squared)
        k_b = 30 + norms * norm_kb - 4 + mixer_kb + 4 * gated + 2 * bool(squared)
        if model.experts:
            # routing (sailor_ext/moe.py): the router's E scores, their fp32 softmax (written, read) and top k
            # (values moved per token in units of d: 4/d per fp32 value); each of the k experts' tokens gathered
            # (h read, h written), its output weighted (h read, h written) and added into the sum (h read, h
            # written), twice as much in backward; about 8 kernels per expert and pass (index, 2 GEMMs, the
            # activation, weighting, index_add) and 8 for routing; backward twice as many
            e = model.experts
            fwd += 2 * e + 3 * 4 / d * e + mlps * 6 * h
            bwd += 2 * e + 3 * 4 / d * e + mlps * 12 * h
            k_f, k_b = k_f + 8 * e + 8, k_b + 16 * e + 8
            if model.router_sigmoid:  # DeepSeek's: the score bias added, the groups' best two, the mask (fp32)
                fwd, bwd, k_f, k_b = fwd + 3 * 4 / d * e, bwd + 4 / d * e, k_f + 6, k_b + 2
            if model.shared_expert_ffn:  # one more MLP of its width for every token, its output gated (the gate's
                # linear, sigmoid and product: 2h fwd, 5h bwd, 3 and 6 kernels; GraniteMoeShared has none) and added
                fs, gate = model.shared_expert_ffn, model.shared_expert_gated
                fwd += ((2 if gated else 1) * fs + fs + (3 if gated else 2) * fs) / t + 3 * h + 2 * h * gate
                bwd += (2 * ((2 if gated else 1) * fs + fs) + (5 if gated else 3) * fs) / t + 3 * h + 5 * h * gate
                k_f, k_b = k_f + 7 + 3 * gate, k_b + 14 + 6 * gate
        if model.latent:  # the latents' two norms; three copies (q, k and v put together) each way
            k_f, k_b = k_f + 2 * norm_kf + 3, k_b + 2 * norm_kb + 3
        if (model.qk_norm or model.qk_l2_norm and rotary) and not linear:  # two more norms, over q and k (q + kv
            # values per token, split over TP)
            fwd, bwd = fwd + norm_f * (q + kv) / t, bwd + norm_b * (q + kv) / t
            k_f, k_b = k_f + 2 * norm_kf, k_b + 2 * norm_kb
        # norms across the heads of all TP ranks: their sums of squares all-reduced, one per norm and pass (a value
        # per token: their latency counts, not their bytes)
        qk_sums = 2 * ar if model.qk_norm_full and not linear else 0.0
        if model.attn_softcap and not linear:
            fwd, bwd, k_f, k_b = fwd + 6 * scores / t, bwd + 7 * scores / t, k_f + 3, k_b + 3
        if model.attention_sinks and not linear:  # q and k widened (the sink's dimension, padding), k and v given
            # the sink's key and value, the mask widened: read and written once more forward, their gradients sliced
            # backward
            fwd, bwd, k_f, k_b = fwd + 2 * (q + 2 * kv) / t, bwd + 2 * (q + 2 * kv) / t, k_f + 6, k_b + 3
        if model.glu_limit:  # gpt-oss's clamped GLU: two clamps, the scaled sigmoid, up + 1 and one more product,
            # five more elementwise kernels per expert forward, ten backward, each moving about 2 f values
            fwd, bwd = fwd + mlps * 10 * f / t, bwd + mlps * 20 * f / t
            k_f, k_b = k_f + 5 * model.experts, k_b + 10 * model.experts
        if model.residual_multiplier != 1:
            fwd, bwd, k_f, k_b = fwd + 4 * h, bwd + 4 * h, k_f + 2, k_b + 2
        if model.query_scaled(layer - 1):  # q times its position's factor (Ministral 3, Llama 4): q read and
            # written each way; the factors (s values) take about 7 small kernels forward
            fwd, bwd, k_f, k_b = fwd + 2 * q / t, bwd + 2 * q / t, k_f + 8, k_b + 1
        flops = n * model.forward_flops(layer) / t
        bwd_flops = 2 * flops
        if model.attention_gate and not linear:  # the output times sigmoid(gate): the gate written by QKV, its
            # sigmoid and the product (read, written), twice backward; three kernels forward, six backward
            fwd, bwd, k_f, k_b = fwd + 5 * q / t, bwd + 10 * q / t, k_f + 3, k_b + 6
        if attention == "sdpa" and not model.attn_softcap and not linear:
            square = n * 2.0 * model.seq_len * (q + c) / t  # [FLOP] QK^T and AV over the whole s x s
            wide = square * (1 + model.sink_dims / (2 * model.head_dim))  # QK^T over heads widened for sinks
            causal = not (0 < model.window(layer - 1) < model.seq_len or model.attention_sinks or
                          model.chunk(layer - 1))  # (a mask)
            attn = wide / 2 if causal else wide
            flops, bwd_flops = flops - square + attn, bwd_flops - 2 * square + FLASH_BACKWARD * attn
            k_v = q + c if model.latent else 2 * kv  # K and V
            fwd += (q + c + k_v) / t - (4 if fused else 7) * scores / t
            bwd += 2 * (q + c + k_v) / t - (7 if fused else 9) * scores / t
            k_f, k_b = k_f - 2 - (0 if fused else 1), k_b - 2 - (0 if fused else 3)
        return (Work(flops, n * fwd * d + weights, 0.0, k_f + 2 * ar + qk_sums, 2 * comm, 2 * ar + qk_sums),
                Work(bwd_flops, 0.0, n * bwd * d + 2 * weights, k_b + 2 * ar + qk_sums, 2 * comm, 2 * ar + qk_sums,
                     True))
    if kind == HEAD:
        vocab = model.padded_vocab(t) / t
        own_norm = model.final_norm and not model.separate_final_norm
        nf, nb, kf, kb = (norm_f, norm_b, norm_kf, norm_kb) if own_norm else (0.0, 0.0, 0, 0)
        weights = model.padded_vocab(t) // t * model.word_dim * d  # [B] the logit GEMM's, tied or not
        flops = n * model.forward_flops(layer) / t
        cap, div = (1 if model.logit_softcap else 0), (1 if model.logits_divisor != 1 else 0)
        fwd = n * ((nf * h + (3 + 6 * cap + 2 * div) * vocab) * d + 8 * vocab * CE_BYTES) + weights
        bwd = n * ((nb * h + 2 * h + (4 + 7 * cap + 2 * div) * vocab) * d + 2 * vocab * CE_BYTES) + 2 * weights
        return (Work(flops, fwd, 0.0, 12 + kf + 3 * cap + div, 3 * n * CE_BYTES if t > 1 else 0.0, 3 * ar),
                Work(2 * flops, bwd, 0.0, 8 + kb + 3 * cap + div, comm, ar, True))
    if kind == FINAL_NORM:
        weights = model.params(layer, tp) * d
        return (Work(0.0, n * norm_f * h * d + weights, kernels=norm_kf),
                Work(0.0, n * norm_b * h * d + 2 * weights, kernels=norm_kb, backward=True))
    assert kind == EMBEDDING
    projection = 2.0 * n * model.word_dim * h if model.projected else 0.0
    positions = model.learned_positions
    scaled = model.embedding_multiplier != 1
    nf, nb, kf, kb = (norm_f, norm_b, norm_kf, norm_kb) if model.embedding_norm else (0.0, 0.0, 0, 0)
    fwd = (2 + 5 * positions + 2 + (2 if t > 1 else 0) + 2 * scaled + nf) * h
    bwd = (4 + 2 * positions + 2 * scaled + nb) * h
    return (Work(projection, n * fwd * d, 0.0, 2 + 2 * positions + (4 if t > 1 else 0) + scaled + kf, comm, ar),
            Work(2 * projection, n * bwd * d, 0.0, 2 + 2 * positions + scaled + kb, backward=True))
