"""Attention pieces megatron-core's local spec does not give us: fused core
attention, rotary frequencies as Hugging Face defines them, window masks.

`FusedCoreAttention` replaces megatron's `DotProductAttention` (same
constructor and call, so megatron's `SelfAttention` builds it from a spec):
`torch.nn.functional.scaled_dot_product_attention` picks flash or
memory-efficient kernels on CUDA and never materialises the probabilities
when the mask is plain causal. Grouped-query attention is passed through
(`enable_gqa`), not expanded.

Masks follow megatron's convention (True = may not attend); None means plain
causal attention, which lets SDPA use its causal kernels.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from planner.specs.model import ModelSpec


class FusedCoreAttention(nn.Module):
    """softmax(scale * q k^T + mask) v over [s, b, heads, head_dim] tensors (dropout 0).

    With a soft cap c (Gemma 2) the scores become c * tanh(scores / c) before the mask, which no fused
    kernel does: those stages compute the scores and probabilities in full (capped_attention). With
    attention sinks (gpt-oss) each head's learned logit joins the softmax as one more key with no value
    (sink_attention, fused). The sinks are this rank's heads' [heads / tp], split with the heads. With q/k
    norms after the rotary positions (HunYuan) q and k are normalised here, by the block's norms
    (post_rotary_norms, sailor_ext.model.PostRotaryRMSNorm). With ALiBi (BLOOM) each head's slope times the key's
    position joins the scores (alibi_attention)."""

    def __init__(self, config, layer_number: int, attn_mask_type=None, attention_type: str = "self",
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type=None, pg_collection=None):
        super().__init__()
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.softcap = getattr(config, "sailor_attn_softcap", 0.0)
        # (beta, span, offset): ModelSpec.query_scale_*, on this block
        self.query_scale = getattr(config, "sailor_query_scale", (0.0, 0, 0))
        self.post_rotary_norms = ()  # (q norm, k norm), set by the block (a tuple: their weights are the block's)
        self.alibi_slopes = None  # ALiBi's slopes of this rank's heads [heads / tp], set by the block (BLOOM)
        if getattr(config, "sailor_attn_sinks", False):  # built on the CPU as megatron's layers are
            local_heads = config.num_attention_heads // config.tensor_model_parallel_size
            self.sinks = nn.Parameter(torch.empty(local_heads, device=torch.device("cpu")))

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if self.post_rotary_norms:
            query, key = (norm.after_rotary(t) for norm, t in zip(self.post_rotary_norms, (query, key)))
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        beta, span, offset = self.query_scale
        if beta and q.size(2) - 1 + offset >= span:  # (the factor is 1 while p + offset < span)
            q = q * query_scale(q.size(2), beta, span, offset, q.device).to(q.dtype)[:, None]
        if self.softcap:
            out = capped_attention(q, k, v, attention_mask, self.scale, self.softcap)
        elif self.alibi_slopes is not None:
            out = alibi_attention(q, k, v, attention_mask, self.scale, self.alibi_slopes)
        elif hasattr(self, "sinks"):
            out = sink_attention(q, k, v, attention_mask, self.scale, self.sinks)
        elif attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                                 enable_gqa=k.size(1) != q.size(1))
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask, scale=self.scale,
                                                 enable_gqa=k.size(1) != q.size(1))
        s, b = query.size(0), query.size(1)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)  # [s, b, heads * d]


def query_scale(seq_len: int, beta: float, span: int, offset: int, device: torch.device) -> torch.Tensor:
    """q's factor at each position p [s] (fp32): 1 + beta * ln(1 + floor((p + offset) / span)) (Ministral 3's,
    offset 0; Llama 4's temperature tuning, offset 1)."""
    positions = torch.arange(offset, seq_len + offset, device=device)
    return 1 + beta * torch.log(1 + torch.floor(positions / span))


def capped_attention(q, k, v, mask: torch.Tensor | None, scale: float, cap: float) -> torch.Tensor:
    """softmax(c * tanh(scale * q k^T / c) + mask) v over [b, heads, s, d]; the softmax in fp32.
    Grouped k and v heads serve heads / kv_heads query heads each, in order."""
    if k.size(1) != q.size(1):
        k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
    scores = torch.tanh(torch.matmul(q, k.transpose(-1, -2)) * scale / cap) * cap
    if mask is None:
        mask = window_mask(q.size(2), q.size(2), q.device)  # causal: a window as long as the sequence
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def sink_attention(q, k, v, mask: torch.Tensor | None, scale: float, sinks: torch.Tensor) -> torch.Tensor:
    """Attention over [b, heads, s, d] whose softmax also covers a learned logit per head, the sink [heads],
    whose probability is dropped: query i's weights are exp(score_ij) / (sum_j exp(score_ij) + exp(sink)).

    The sink runs as one more key, first, visible to every query, with a value of 0: each query gains a
    dimension holding sink / scale and each key a 0 there, the sink's key a 1 (so q'.k' = q.k for the
    sequence's keys and sink / scale for the sink's, times scale), zeros padding the head to a multiple of
    8 as fused kernels want. The sink rides on each head's own queries, so keys that grouped heads share stay
    shared, and PyTorch's fused kernels (with the explicit mask: the memory-efficient one on CUDA) never hold
    the scores."""
    b, heads, s, d = q.shape
    pad = 8 - d % 8  # the sink's dimension, then zeros (ModelSpec.sink_dims)
    sink = (sinks.to(q.dtype) / scale).view(1, heads, 1, 1).expand(b, heads, s, 1)
    q = torch.cat([q, sink, q.new_zeros(b, heads, s, pad - 1)], dim=-1)
    sink_key = F.pad(k.new_ones(b, k.size(1), 1, 1), (d, pad - 1))  # [0..0, 1, 0..]
    k = torch.cat([sink_key, F.pad(k, (0, pad))], dim=2)
    v = torch.cat([v.new_zeros(b, v.size(1), 1, d), v], dim=2)
    hidden = window_mask(s, s, q.device) if mask is None else mask  # True: may not attend
    allowed = torch.cat([torch.ones(*hidden.shape[:-1], 1, dtype=torch.bool, device=q.device), ~hidden], dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=k.size(1) != heads)


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's slope per head [heads], fp32 (Press et al., as BLOOM applies them): with n the largest power of two
    up to heads, head i = 1..n gets b^i, b = 2^(-8/n); the heads beyond n get c^1, c^3, c^5, ..., c = 2^(-4/n)
    (the odd steps of the series for 2n heads). The powers are taken of the fp32 base, as transformers takes them."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = torch.tensor(2.0 ** (-8.0 / n)) ** torch.arange(1, n + 1)
    extra = torch.tensor(2.0 ** (-4.0 / n)) ** torch.arange(1, 1 + 2 * min(n, heads - n), 2)
    return torch.cat([slopes, extra])


def alibi_attention(q, k, v, mask: torch.Tensor | None, scale: float, slopes: torch.Tensor) -> torch.Tensor:
    """softmax(scale * q k^T + slope_h * j + mask) v over [b, heads, s, d]: ALiBi's bias, each head's slope
    [heads] times the key's position j, in q's dtype. Row by row it equals slope_h * (j - i), the distance's
    penalty, since a softmax ignores a constant per row. The bias [1, heads, s, s] is one for the whole batch."""
    s = q.size(2)
    hidden = window_mask(s, s, q.device) if mask is None else mask  # True: may not attend
    bias = (slopes.to(q.device)[:, None, None] * torch.arange(s, device=q.device, dtype=torch.float32)).to(q.dtype)
    bias = bias.expand(-1, s, s)[None].masked_fill(hidden, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=k.size(1) != q.size(1))


def window_mask(seq_len: int, window: int, device: torch.device, chunk: int = 0) -> torch.Tensor:
    """[1, 1, s, s], True where query i may not see key j: j > i, or i - j >= window (0: no window), or i and j
    in different chunks of `chunk` tokens (Llama 4's chunked attention; 0: none)."""
    i = torch.arange(seq_len, device=device)
    distance = i[:, None] - i[None, :]
    hidden = (distance < 0) | (distance >= window) if window else distance < 0
    if chunk:
        hidden |= (i[:, None] // chunk) != (i[None, :] // chunk)
    return hidden[None, None]


def inverse_frequencies(model: ModelSpec, local: bool = False) -> torch.Tensor:
    """RoPE's inverse frequencies per pair of rotated head dimensions [rotary_dim / 2], fp32.

    inv_freq_i = theta^(-2i/d), d the rotated dimensions (megatron's apply_rotary_pos_emb
    rotates as many leading dimensions of each head as the angles have, and passes the
    rest). LLaMA 3.1's scaling (rope type llama3) keeps wavelengths shorter than
    original_context/high_freq_factor, divides those longer than
    original_context/low_freq_factor by `factor`, and interpolates smoothly in
    between; linear scaling divides all by `factor`; LongRoPE divides each by its own factor,
    the long ones when the training sequence is longer than the original context, else the
    short ones (its attention factor scales cos and sin: rotary_mscale); YaRN blends each
    frequency and its interpolation by a ramp over the pairs (_yarn). local: Gemma 3's and OLMo 3's
    windowed blocks, with their own base (local_rope_theta) and no scaling.
    """
    d = model.rotary_dim  # (head_dim unless only a share of each head rotates)
    theta = model.local_rope_theta if local else model.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = {} if local else dict(model.rope_scaling)
    kind = scaling.get("type")
    if kind == "longrope":  # 1 / (factor_i * theta^(2i/d)), in that order, as transformers computes it
        factors = scaling["long_factor"] if model.seq_len > scaling["original_max_position_embeddings"] \
            else scaling["short_factor"]
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) *
                      theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "yarn":
        return _yarn(d, theta, scaling)
    if kind == "ntk_alpha":  # HunYuan's: the base stretched by alpha^(d / (d - 2)), d the head dimension
        theta = theta * scaling["alpha"] ** (model.head_dim / (model.head_dim - 2))
        return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        context = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
        smooth = (context / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= context / high) & (wavelength <= context / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def _yarn(d: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN's frequencies (planner/specs/families/llama._yarn). Pair i turns r_i = L / (2 pi theta^(2i/d))
    times over the original context L; solved for i, r rotations sit at dimension
    i(r) = d ln(L / (2 pi r)) / (2 ln theta). Pairs below i(beta_fast) keep their frequency (extrapolated),
    pairs above i(beta_slow) are divided by the factor (interpolated), a linear ramp in between."""
    def dim(rotations: float) -> float:
        return d * math.log(scaling["original_max_position_embeddings"] / (rotations * 2 * math.pi)) / \
            (2 * math.log(theta))

    low, high = dim(scaling["beta_fast"]), dim(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low if high != low else 0.001)).clamp(0, 1)
    keep = 1 - ramp  # the share of each pair's original frequency
    wavelength = theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)  # over 2 pi; transformers' order:
    return 1.0 / (scaling["factor"] * wavelength) * (1 - keep) + 1.0 / wavelength * keep


def rotary_mscale(model: ModelSpec) -> float:
    """The factor on cos and sin of the rotary positions: LongRoPE's and YaRN's attention factor, else 1."""
    return float(dict(model.rope_scaling).get("attention_factor", 1.0))


def rotary_embedding(model: ModelSpec, seq_len: int, device: torch.device, local: bool = False) -> torch.Tensor:
    """Angles [s, 1, 1, rotary_dim] for megatron's apply_rotary_pos_emb: position * inv_freq,
    twice: after each other (the rotate-half layout Hugging Face's LLaMA uses), or each angle
    twice in a row for models that rotate adjacent pairs (Cohere; megatron's rotary_interleaved); negated for
    models that turn the other way (nanochat)."""
    positions = torch.arange(seq_len, dtype=torch.float32)
    freqs = torch.outer(positions, inverse_frequencies(model, local))
    if model.rotary_reversed:  # (nanochat's: cos(-a) = cos(a), sin(-a) = -sin(a))
        freqs = -freqs
    angles = freqs.repeat_interleave(2, dim=-1) if model.rotary_interleaved else torch.cat([freqs, freqs], dim=-1)
    return angles[:, None, None, :].to(device)
