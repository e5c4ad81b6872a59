"""Multi-head latent attention (DeepSeek-V2/V3), sharded over the TP group.

Each token's keys and values come from one latent c_kv, kv_lora_rank wide, and its queries from one latent
c_q, q_lora_rank wide (or from the hidden state x directly when the model has no q latent):

    c_q = norm(x W_dq)                 q = c_q W_uq      [heads, nope + rope]
    [c_kv; k_rope] = x W_dkv           [k_nope; v] = norm(c_kv) W_ukv      [heads, nope + v_head_dim]
    q = [q_nope; rotary(q_rope)]       k = [k_nope; rotary(k_rope)]   (k_rope: one for all heads)
    out = softmax(scale q k^T + causal) v W_o

Tensor parallelism splits the heads, as Megatron's MLA does: the up-projections W_uq and W_ukv are
column-parallel (each rank its heads' rows), W_o row-parallel; the down-projections W_dq and W_dkv and the
latents' norms are replicated, every rank computing the same latents. Their gradients are whole on every
rank: the column-parallel up-projections all-reduce the gradient of their input (the normalised latents),
and the shared rotary key, which each rank uses for its own heads only, passes through
copy_to_tensor_model_parallel_region (identity forward, all-reduce backward). So the gradient reaching x is
whole too, as ordinary attention's fused QKV leaves it.

Rotary positions turn the last rope_head_dim dimensions of each q and k head: adjacent pairs with DeepSeek's
rope_interleave (megatron's rotary_interleaved; transformers de-interleaves the pairs after turning them, a
permutation that q and k share and the dot products do not see), halves without it.
"""
from __future__ import annotations

import torch
from torch import nn

from sailor_ext import compat  # noqa: F401  (installs warning filters before megatron imports)
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region  # noqa: E402
from megatron.core.transformer import attention as mcore_attention  # noqa: E402

from planner.specs.model import ModelSpec  # noqa: E402
from sailor_ext.attention import FusedCoreAttention  # noqa: E402


# the latents' norms' epsilon, whatever rms_norm_eps says: RMSNorm's default in DeepSeek's code and transformers'
# (Moonlight's and GLM-4.7-Flash's blocks use 1e-5)
LATENT_NORM_EPS = 1e-6


class LatentAttention(nn.Module):
    """forward(x [s, b, h], attention_mask, rotary_pos_emb) -> (out [s, b, h], None), as megatron's
    SelfAttention returns (output, bias)."""

    def __init__(self, model: ModelSpec, config, norm, layer_number: int, tp_group):
        """norm(width, eps): the model's norm module of that width (the latents' norms)."""
        super().__init__()
        h, tp = model.hidden, config.tensor_model_parallel_size
        self.config, self.tp_group = config, tp_group
        self.heads = model.heads // tp  # this rank's
        self.rope, self.nope, self.v = model.rope_head_dim, model.head_dim - model.rope_head_dim, model.v_head_dim
        self.kv_rank = model.kv_lora_rank
        cpu = torch.device("cpu")  # built on the CPU as megatron's layers are; the stage moves them

        def column(width_in: int, width_out: int) -> ColumnParallelLinear:
            return ColumnParallelLinear(width_in, width_out, config=config, init_method=None, bias=False,
                                        gather_output=False, tp_group=tp_group)

        if model.q_lora_rank:
            self.linear_q_down_proj = nn.Linear(h, model.q_lora_rank, bias=False, device=cpu)
            self.q_latent_layernorm = norm(model.q_lora_rank, LATENT_NORM_EPS)
            self.linear_q_up_proj = column(model.q_lora_rank, model.q_dim)
        else:
            self.linear_q_proj = column(h, model.q_dim)
        self.linear_kv_down_proj = nn.Linear(h, model.kv_lora_rank + self.rope, bias=False, device=cpu)
        self.kv_latent_layernorm = norm(model.kv_lora_rank, LATENT_NORM_EPS)
        self.linear_kv_up_proj = column(model.kv_lora_rank, model.heads * (self.nope + self.v))
        self.core_attention = FusedCoreAttention(config, layer_number, softmax_scale=config.softmax_scale)
        self.linear_proj = RowParallelLinear(model.context_dim, h, config=config, init_method=None, bias=False,
                                             input_is_parallel=True, skip_bias_add=True, tp_group=tp_group)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                rotary_pos_emb: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        s, b = x.shape[:2]
        if hasattr(self, "linear_q_proj"):
            q, _ = self.linear_q_proj(x)
        else:
            q, _ = self.linear_q_up_proj(self.q_latent_layernorm(self.linear_q_down_proj(x)))
        q_nope, q_rope = q.view(s, b, self.heads, self.nope + self.rope).split([self.nope, self.rope], dim=-1)
        latent, k_rope = self.linear_kv_down_proj(x).split([self.kv_rank, self.rope], dim=-1)
        kv, _ = self.linear_kv_up_proj(self.kv_latent_layernorm(latent))
        k_nope, value = kv.view(s, b, self.heads, self.nope + self.v).split([self.nope, self.v], dim=-1)
        # this rank's heads use the shared key: backward sums its gradient over the ranks' heads
        k_rope = copy_to_tensor_model_parallel_region(k_rope, group=self.tp_group).unsqueeze(2)
        q_rope, k_rope = (mcore_attention.apply_rotary_pos_emb(  # (sailor_ext.model's, with the model's cos/sin factor)
            t, rotary_pos_emb, self.config, cp_group=compat.NO_CONTEXT_PARALLEL) for t in (q_rope, k_rope))
        query = torch.cat([q_nope, q_rope], dim=-1)
        key = torch.cat([k_nope, k_rope.expand(s, b, self.heads, self.rope)], dim=-1)
        context = self.core_attention(query, key, value.contiguous(), attention_mask)
        out, _ = self.linear_proj(context)
        return out, None
