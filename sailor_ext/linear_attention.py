"""Gated DeltaNet (Qwen3.5, Qwen3-Next): linear attention whose state is corrected by the delta rule.

Per token t and value head, with q, k of width d_k (L2-normalised, q scaled by d_k^-1/2) and v of width
d_v, a decay g_t = -exp(A_log) softplus(a_t + dt_bias) < 0 and a step beta_t = sigmoid(b_t):

    S_t = e^{g_t} S_{t-1}                            the state [d_k, d_v], decayed
    u_t = beta_t (v_t - k_t^T S_t)                   what the state mispredicts for k_t, times the step
    S_t = S_t + k_t u_t^T,      o_t = q_t^T S_t      the correction written, then read by q

q, k and v first pass a causal depthwise convolution of linear_conv taps and SiLU; the output is normalised
per head (RMSNorm over d_v) times SiLU of a gate z, then projected back to the hidden width.

The recurrence runs in chunks of C = DELTA_CHUNK tokens (the WY form of the DeltaNet papers): within a chunk,
with G_i the cumulative decay from its start and Gamma_ij = e^{G_i - G_j} for j <= i, the corrections solve
one unit lower-triangular system, (I + strictly_lower(beta K K^T * Gamma)) U = beta V - beta e^G K S_0, so
that the chunk's outputs are e^G Q S_0 + (Q K^T * Gamma, causal) U and the next state e^{G_C} S_0 +
(e^{G_C - G} K)^T U. All of it runs in fp32, as transformers' and the fla kernels' do.

Tensor parallelism splits the heads: each k head serves linear_value_heads / linear_key_heads consecutive v
heads, so a rank takes whole key heads with their v heads. The fused projection to [q; k; v] (and the
convolution's taps) are kept grouped by key head, [q_g; k_g; v of g's value heads] for each key head g, so
a column-parallel split gives each rank its own groups (sailor_ext.hf converts from transformers' [q; k; v]).
The projections to z, beta's b and the decay's a are column-parallel over the value heads, as are A_log
and dt_bias; the output projection is row-parallel. The output norm's weight, one per value-head width, is
shared by every head of every rank: its gradient is partial (ParamShard.partial_grad).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sailor_ext import compat  # noqa: F401  (installs warning filters before megatron imports)
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402

from planner.specs.model import DELTA_CHUNK, ModelSpec  # noqa: E402


def l2_normalise(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dimension (the fla kernels' and transformers' eps)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     chunk: int = DELTA_CHUNK) -> torch.Tensor:
    """The outputs o [b, H, s, d_v] (fp32) of the recurrence in the module docstring, from q and k [b, H, s, d_k]
    (normalised and scaled), v [b, H, s, d_v], the log decays g and the steps beta [b, H, s], the state
    starting at 0."""
    b, heads, s, dk = k.shape
    dv = v.size(-1)
    pad = -s % chunk
    if pad:  # padded tokens come last: they change no earlier output
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    n = (s + pad) // chunk
    q, k, v = (t.reshape(b, heads, n, chunk, -1) for t in (q, k, v))
    g, beta = g.reshape(b, heads, n, chunk), beta.reshape(b, heads, n, chunk)
    cum = g.cumsum(-1)  # G_i: the log decay from the chunk's start through token i
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # j > i
    gamma = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(later, float("-inf")).exp()  # e^{G_i - G_j}, j <= i
    k_beta = k * beta.unsqueeze(-1)
    # I + strictly_lower(beta K K^T * Gamma): the solves read only the strictly lower triangle, 1 on the diagonal
    unit = (k_beta @ k.transpose(-1, -2)) * gamma
    values = torch.linalg.solve_triangular(unit, v * beta.unsqueeze(-1), upper=False, unitriangular=True)
    decayed_keys = torch.linalg.solve_triangular(unit, k_beta * cum.exp().unsqueeze(-1), upper=False,
                                                 unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * gamma  # causal within the chunk (gamma is 0 above the diagonal)
    q_decayed = q * cum.exp().unsqueeze(-1)
    k_to_end = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    state = q.new_zeros(b, heads, dk, dv)
    out = []
    for i in range(n):
        u = values[:, :, i] - decayed_keys[:, :, i] @ state
        out.append(q_decayed[:, :, i] @ state + scores[:, :, i] @ u)
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ u
    return torch.stack(out, dim=2).reshape(b, heads, n * chunk, dv)[:, :, :s]


class ShortConv(nn.Module):
    """The causal depthwise convolution over this rank's [q; k; v] channels, weight [channels, 1, taps]."""

    def __init__(self, channels: int, taps: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, taps, device=torch.device("cpu")))  # moved with the stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, channels, s] -> SiLU(conv(x)) [b, channels, s], each output from its token and the taps - 1
        before it."""
        s, taps = x.size(-1), self.weight.size(-1)
        return F.silu(F.conv1d(x, self.weight, padding=taps - 1, groups=x.size(1))[..., :s])


class GatedRMSNorm(nn.Module):
    """RMSNorm over each value head's d_v, times SiLU(z): normalised in fp32, the weight applied in the input's
    dtype, the gate's SiLU in fp32 (transformers' and the fla kernels' order)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, device=torch.device("cpu")))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype))
        return (normed * F.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """forward(x [s, b, h], attention_mask, rotary_pos_emb) -> (out [s, b, h], None), as megatron's
    SelfAttention returns (output, bias); the mask and rotary positions are not used (causal by construction,
    positions carried by the convolution and the recurrence)."""

    def __init__(self, model: ModelSpec, config, tp_group):
        super().__init__()
        h, tp = model.hidden, config.tensor_model_parallel_size
        self.key_heads, self.value_heads = model.linear_key_heads // tp, model.linear_value_heads // tp  # this rank's
        self.dk, self.dv = model.linear_key_dim, model.linear_value_dim
        channels = 2 * model.linear_k_dim + model.linear_v_dim

        def column(width_out: int) -> ColumnParallelLinear:
            return ColumnParallelLinear(h, width_out, config=config, init_method=None, bias=False,
                                        gather_output=False, tp_group=tp_group)

        self.linear_qkv = column(channels)  # grouped by key head (module docstring)
        self.linear_z, self.linear_b, self.linear_a = (column(w) for w in (model.linear_v_dim,
                                                                            model.linear_value_heads,
                                                                            model.linear_value_heads))
        self.conv = ShortConv(channels // tp, model.linear_conv)
        cpu = torch.device("cpu")
        self.dt_bias = nn.Parameter(torch.ones(self.value_heads, device=cpu))
        self.A_log = nn.Parameter(torch.zeros(self.value_heads, device=cpu))
        self.out_norm = GatedRMSNorm(self.dv, model.norm_eps)
        self.linear_proj = RowParallelLinear(model.linear_v_dim, h, config=config, init_method=None, bias=False,
                                             input_is_parallel=True, skip_bias_add=True, tp_group=tp_group)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                rotary_pos_emb: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        s, b = x.shape[:2]
        mixed, _ = self.linear_qkv(x)
        mixed = self.conv(mixed.permute(1, 2, 0)).permute(0, 2, 1)  # [b, s, channels]
        per_value = self.value_heads // self.key_heads
        q, k, v = mixed.reshape(b, s, self.key_heads, -1).split([self.dk, self.dk, per_value * self.dv], dim=-1)
        q, k = (l2_normalise(t.float()).repeat_interleave(per_value, dim=2).transpose(1, 2) for t in (q, k))
        v = v.reshape(b, s, self.value_heads, self.dv).transpose(1, 2).float()
        beta = torch.sigmoid(self.linear_b(x)[0]).permute(1, 2, 0).float()  # [b, heads, s]
        a = self.linear_a(x)[0].permute(1, 2, 0).float()
        g = -self.A_log.float().exp()[:, None] * F.softplus(a + self.dt_bias[:, None])
        out = gated_delta_rule(q * self.dk ** -0.5, k, v, g, beta).to(x.dtype)  # [b, heads, s, d_v]
        z, _ = self.linear_z(x)
        out = self.out_norm(out.permute(2, 0, 1, 3), z.view(s, b, self.value_heads, self.dv))
        proj, _ = self.linear_proj(out.reshape(s, b, -1))
        return proj, None
