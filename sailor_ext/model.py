"""A decoder of any family, cut into the plan's stages, on megatron-core layers.

Layers are numbered as in planner's ModelSpec: 0 is the embedding (a
`VocabParallelEmbedding`, OPT-350m's projection to the block width, learned
positions where the family has them), 1..n are transformer blocks, n+1 is the
final norm where it is a layer of its own (LLaMA), the last is the head
(final norm, projection back to the embedding width, a column-parallel output
layer whose logits stay split over the vocabulary; the loss is computed from
them in `loss.py`).

Every choice between families is a ModelSpec field, read here and nowhere
else: the norm (LayerNorm or RMSNorm), pre- or post-norm blocks, the MLP
(GELU, tanh-GELU, ReLU, or SwiGLU with fc1 = [gate; up]; a mixture of experts
in moe.py), which linears have biases, grouped-query attention, per-head q/k
norms (OLMo 2's across all heads, Command R+'s one per head), attention sinks (gpt-oss), DeepSeek's latent
attention (latent_attention.py) and its dense first blocks among experts, Qwen3.5's Gated DeltaNet blocks
(linear_attention.py) and its attention's output gate, rotary positions
(megatron's apply_rotary_pos_emb, frequencies from sailor_ext.attention; Gemma 3's
and OLMo 3's windowed blocks have their own, unscaled), the attention scale,
per-block attention windows, Gemma's touches ((1 + w) norms, a norm on each
sublayer's output, soft caps on attention scores and logits), OLMo 2's norms on the sublayers'
outputs only, and the multipliers of Gemma and Granite (word embeddings, residual branches,
logits). A block is megatron's `SelfAttention`
and `MLP` with their column/row-parallel linears, wired as a residual block
here (megatron's TransformerLayer knows only pre-norm). Every module gets its
TP group explicitly; megatron's global parallel state is never set up.

Weights are initialised from the seed as full logical tensors, one generator
per logical name, and each rank keeps its slice, so every plan (and the
single-process run) starts from identical weights. Dropout is 0.

On CUDA two elementwise chains run as compiled kernels (`KernelFusion`,
torch.compile, as Megatron's own fusions are): SwiGLU through megatron's
bias_swiglu_impl, and rotary positions through megatron's unfused rotary
function compiled whole (megatron's fused rotary kernel needs Transformer
Engine). They are Megatron-LM's --no-bias-swiglu-fusion and --no-rope-fusion.

A stage with `recompute` runs each block under activation checkpointing: the
forward keeps only the block's input, and backward runs the block's forward
again to rebuild what it needs (less memory per microbatch in flight, one
more forward of compute; dropout 0 makes the rerun exact).
"""
from __future__ import annotations

import copy
import functools
import math
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from sailor_ext import compat  # noqa: F401  (installs warning filters before megatron imports)
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.models.common.embeddings import rope_utils  # noqa: E402
from megatron.core.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from megatron.core.transformer import attention as mcore_attention  # noqa: E402
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.mlp import MLP, MLPSubmodules  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from planner.specs.model import BLOCK, EMBEDDING, FINAL_NORM, ModelSpec  # noqa: E402
from sailor_ext.attention import (FusedCoreAttention, alibi_slopes, rotary_embedding, rotary_mscale,  # noqa: E402
                                  window_mask)
from sailor_ext.latent_attention import LatentAttention  # noqa: E402
from sailor_ext.linear_attention import GatedDeltaNet, ShortConv  # noqa: E402
from sailor_ext.moe import ExpertWeights, MoE  # noqa: E402
from sailor_ext.sharding import ParamShard  # noqa: E402

INIT_STD = 0.02
WORD_EMBEDDING = "layers.0.word_embeddings.weight"


def _xielu_without_scalars(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("xIELU needs its block's scalars: Block gives each MLP an XIELU module")


# (xielu: transformer_config's placeholder; every block's MLP gets its own XIELU)
ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "relu": F.relu,
               "relu2": lambda x: F.relu(x).square(), "silu": F.silu, "xielu": _xielu_without_scalars}


class XIELU(nn.Module):
    """xIELU (Apertus), with a block's own scalars: alpha_p and alpha_n trained (softplus keeps their
    factors positive), beta and eps fixed (parameters that no gradient reaches, as score biases are, so
    that they load and export with the checkpoint):
        x > 0:  softplus(alpha_p) x^2 + beta x
        x <= 0: (expm1(min(x, eps)) - x) (beta + softplus(alpha_n)) + beta x
    It replaces the MLP's activation function; each TP rank applies it to its share of the MLP's width,
    so the scalars' gradients are partial (ParamShard.partial_grad)."""

    def __init__(self):
        super().__init__()
        cpu = torch.device("cpu")
        self.alpha_p, self.alpha_n = (nn.Parameter(torch.zeros(1, device=cpu)) for _ in range(2))
        self.beta, self.eps = (nn.Parameter(torch.zeros((), device=cpu)) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        beta, eps = self.beta.detach(), self.eps.detach()
        alpha_p, alpha_n = F.softplus(self.alpha_p), beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + beta * x, (torch.expm1(torch.min(x, eps)) - x) * alpha_n + beta * x)


# xIELU's initial scalars, as transformers builds them: alpha_p and alpha_n such that softplus gives 0.8 and
# 0.8 - beta
XIELU_INIT = {"alpha_p": math.log(math.expm1(0.8)), "alpha_n": math.log(math.expm1(0.8 - 0.5)), "beta": 0.5,
              "eps": -1e-6}


@dataclass(frozen=True)
class StageSpec:
    """What one rank builds: a layer range of a model, sharded over a TP group."""

    model: ModelSpec
    first: int  # first layer, inclusive
    last: int  # last layer, inclusive
    tp: int
    tp_rank: int
    padded_vocab: int
    # Stages holding the word embedding; (0, last stage) when the head reuses it.
    embedding_stages: tuple[int, ...] = (0,)
    stage: int = 0
    stage_chunks: int = 1  # finest common chunking of this stage's sharded weights
    embedding_chunks: int = 1  # finest common chunking of the word embedding
    recompute: bool = False  # checkpoint every block: keep its input, rerun its forward in backward
    moe_aux_loss_coeff: float = 0.0  # the router losses' weights (sailor_ext/moe.py): load balancing, z-loss
    moe_z_loss_coeff: float = 0.0
    moe_count_loads: bool = False  # count each expert's tokens (DeepSeek-V3's score bias updates)

    @property
    def layers(self) -> range:
        return range(self.first, self.last + 1)


@dataclass(frozen=True)
class KernelFusion:
    """Which elementwise chains run as one compiled kernel each (torch.compile, Triton on CUDA).

    On an H100 the 1.1 B LLaMA's step spent 44 % of its GPU time outside GEMMs and attention, in
    elementwise kernels: SwiGLU (chunk, silu, mul and their backward) and rotary positions (cos,
    sin, neg, cat, mul, mul, add, cat per call, for q and k) among them; compiling these two took
    the step from 0.597 to 0.524 s at microbatches of 4 (bench/results/h100-2026-11-27). The first
    step of a process pays for the compilation. Off on CPU: compiling costs more than it saves in
    short CPU runs, and the CPU tests compare eager numerics.
    """

    swiglu: bool = False  # megatron's bias_swiglu_impl (its jit_fuser is torch.compile)
    rope: bool = False  # megatron's unfused rotary function, compiled whole

    @classmethod
    def default(cls, device: torch.device, swiglu: bool = True, rope: bool = True) -> KernelFusion:
        """On CUDA, each unless its flag is off; never on CPU."""
        on = device.type == "cuda"
        return cls(swiglu=on and swiglu, rope=on and rope)

    def applied(self, model: ModelSpec) -> list[str]:
        """The fusions this model has the layers for."""
        return [name for name, on in (("swiglu", self.swiglu and model.gated_mlp and model.activation == "silu"
                                                 and not model.experts),
                                      ("rope", self.rope and not model.learned_positions)) if on]


def transformer_config(model: ModelSpec, tp: int, fusion: KernelFusion = KernelFusion()) -> TransformerConfig:
    """megatron's config for one stage: fp32 params (precision.py casts them for bf16), no
    dropout, no fusions that need CUDA extensions (SwiGLU's is torch.compile: see KernelFusion),
    our own initialisation."""
    config = TransformerConfig(
        num_layers=model.num_blocks,
        hidden_size=model.hidden,
        num_attention_heads=model.heads,
        kv_channels=model.head_dim,
        ffn_hidden_size=model.ffn_hidden,
        num_query_groups=model.num_query_groups,
        tensor_model_parallel_size=tp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        add_bias_linear=model.mlp_bias,  # each linear's bias is set on its own (with_bias below)
        add_qkv_bias=model.qkv_bias,
        gated_linear_unit=model.gated_mlp,
        activation_func=ACTIVATIONS[model.activation],
        normalization="RMSNorm" if model.rms_norm else "LayerNorm",
        layernorm_epsilon=model.norm_eps,
        softmax_scale=model.attention_scale or None,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
        bias_dropout_fusion=False,
        bias_activation_fusion="swiglu" in fusion.applied(model),
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        # (q/k norms across all heads, or with a weight per head: WidthRMSNorm, PerHeadNorm, set by Block)
        qk_layernorm=model.qk_norm and not (model.qk_norm_full or model.qk_norm_per_head),
        rotary_interleaved=model.rotary_interleaved,
        attention_output_gate=model.attention_gate,
    )
    config.sailor_rope_fusion = fusion.rope  # read by _rotary below (megatron's own flag wants Transformer Engine)
    config.sailor_attn_softcap = model.attn_softcap  # read by FusedCoreAttention
    config.sailor_attn_sinks = model.attention_sinks  # read by FusedCoreAttention
    # read by FusedCoreAttention (Block sets it per block)
    config.sailor_query_scale = (model.query_scale_beta, model.query_scale_span, model.query_scale_offset)
    config.sailor_rope_mscale = rotary_mscale(model)  # read by _rotary
    return config


@functools.cache
def _compiled_rotary():
    return torch.compile(rope_utils._apply_rotary_pos_emb_bshd)


def _rotary(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    """megatron's apply_rotary_pos_emb, compiled for stages whose config asks (packed sequences,
    interleaved and latent-attention layouts go to megatron's function as they are), with cos and
    sin scaled by the model's factor (LongRoPE's; megatron's own is YaRN's)."""
    mscale = mscale * getattr(config, "sailor_rope_mscale", 1.0)
    if (getattr(config, "sailor_rope_fusion", False) and cu_seqlens is None and not config.rotary_interleaved
            and not config.multi_latent_attention):
        return _compiled_rotary()(t, freqs, mscale=mscale)
    return rope_utils.apply_rotary_pos_emb(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale, cp_group=cp_group)


mcore_attention.apply_rotary_pos_emb = _rotary  # SelfAttention looks the name up in its module


@functools.cache
def with_bias(linear: type, bias: bool) -> type:
    """`linear` with its bias fixed, whatever the config says (megatron ties
    every linear's bias to add_bias_linear; GPT-Neo, Qwen2/3 and LLaMA's
    attention_bias need them one by one)."""

    def __init__(self, *args, **kwargs):
        kwargs["bias"] = bias
        linear.__init__(self, *args, **kwargs)

    return type(f"{linear.__name__}{'' if bias else 'NoBias'}", (linear,), {"__init__": __init__})


def clipped(linear: type, limit: float) -> type:
    """`linear` with its output clamped to [-limit, limit], bias included (OLMo 1.7's clip_qkv on the fused q, k
    and v; megatron adds linear_qkv's bias inside it); `linear` itself where limit is 0."""
    if not limit:
        return linear

    def forward(self, *args, **kwargs):
        out, bias = linear.forward(self, *args, **kwargs)
        return out.clamp(-limit, limit), bias

    return type(f"{linear.__name__}Clipped", (linear,), {"forward": forward})


class OffsetRMSNorm(nn.RMSNorm):
    """Gemma's RMSNorm: x / rms(x) * (1 + w), w initialised at 0, computed in fp32 and cast back
    once at the end (LLaMA's casts before the weight; in bf16 the two round differently)."""

    def __init__(self, width: int, eps: float):
        super().__init__(width, eps=eps)
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class OffsetLayerNorm(nn.LayerNorm):
    """Nemotron's LayerNorm1P: layer_norm(x) * (1 + w) + b, w initialised at 0 (megatron's zero-centred gamma),
    computed in fp32 and cast back once at the end, so that 1 + w keeps w's precision in bf16."""

    def __init__(self, width: int, eps: float, bias: bool):
        super().__init__(width, eps=eps, bias=bias)
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, 1.0 + self.weight.float(), bias, self.eps).type_as(x)


def norm(model: ModelSpec, width: int, eps: float | None = None) -> nn.Module:
    """The model's norm of that width, with its epsilon unless `eps` says otherwise."""
    eps = model.norm_eps if eps is None else eps
    if not model.norm_weight:  # (OLMo 1's LayerNorms, nanochat's RMSNorms: no weight, no bias)
        return nn.RMSNorm(width, eps=eps, elementwise_affine=False) if model.rms_norm else \
            nn.LayerNorm(width, eps=eps, elementwise_affine=False, bias=False)
    if model.norm_offset:
        return OffsetRMSNorm(width, eps=eps) if model.rms_norm else OffsetLayerNorm(width, eps, model.norm_bias)
    if model.rms_norm:
        return nn.RMSNorm(width, eps=eps)
    return nn.LayerNorm(width, eps=eps, bias=model.norm_bias)


class HeadRMSNorm(nn.RMSNorm):
    """The per-head q (k) norm of a model with qk_norm, built as megatron's SelfAttention builds its
    q_layernorm (hidden_size=head_dim, config, eps). Each TP rank normalises only its own heads
    with the one shared weight, so its gradient is partial (ParamShard.partial_grad)."""

    def __init__(self, hidden_size: int, config: TransformerConfig, eps: float):
        super().__init__(hidden_size, eps=eps)


class PostRotaryRMSNorm(HeadRMSNorm):
    """HunYuan's q (k) norm, after the rotary positions: megatron calls q_layernorm before them, where this
    one passes q through; the core attention applies it (after_rotary) to the rotated heads. Its weight stays
    where megatron keeps q_layernorm's, with the same TP handling."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def after_rotary(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class HeadOffsetRMSNorm(OffsetRMSNorm):
    """HeadRMSNorm with Gemma's (1 + w) (Gemma 3's q and k norms)."""

    def __init__(self, hidden_size: int, config: TransformerConfig, eps: float):
        super().__init__(hidden_size, eps=eps)


class HeadL2Norm(nn.Module):
    """Llama 4's q (k) norm: each head divided by its RMS, in fp32, without a weight."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


class WidthRMSNorm(nn.Module):
    """OLMo 2's q (k) norm: one RMSNorm over all heads' q (k) together, width heads * head_dim. Each
    TP rank holds its heads and their slice of the weight; the sum of squares is all-reduced over
    the group. Computed in fp32, the weight applied before the cast back (transformers' OLMo 2's order)."""

    def __init__(self, width: int, tp: int, eps: float, tp_group):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width // tp, device=torch.device("cpu")))  # moved with the stage
        self.width, self.tp, self.eps, self.tp_group = width, tp, eps, tp_group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [s, b, local heads, head_dim]."""
        x32 = x.float()
        squares = x32.pow(2).sum(dim=(-2, -1), keepdim=True)
        if self.tp > 1:
            squares = dist_nn.all_reduce(squares, group=self.tp_group)  # summed in backward too: every rank uses it
        out = x32 * torch.rsqrt(squares / self.width + self.eps)
        return (out * self.weight.float().view(x.shape[-2:])).type_as(x)


class PerHeadNorm(nn.Module):
    """Command R+'s q (k) norm: each head normalised over its head_dim with a weight of its own, [local heads,
    head_dim], this TP rank's heads' rows. A LayerNorm without bias, or an RMSNorm as the model's norms are,
    computed in fp32 with the weight applied before the cast back (transformers' CohereLayerNorm)."""

    def __init__(self, local_heads: int, head_dim: int, rms: bool, eps: float):
        super().__init__()
        # built on the CPU, moved with the stage
        self.weight = nn.Parameter(torch.ones(local_heads, head_dim, device=torch.device("cpu")))
        self.rms, self.eps = rms, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [s, b, local heads, head_dim]."""
        x32 = x.float()
        if not self.rms:
            x32 = x32 - x32.mean(-1, keepdim=True)
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * out).type_as(x)


class Embedding(nn.Module):
    """Word embedding (vocabulary-parallel), OPT-350m's projection, learned positions, a norm (nanochat's)."""

    def __init__(self, spec: StageSpec, config: TransformerConfig, tp_group):
        super().__init__()
        model = spec.model
        self.model = model
        self.word_embeddings = VocabParallelEmbedding(spec.padded_vocab, model.word_dim, init_method=None,
                                                      config=config, tp_group=tp_group)
        if model.projected:
            self.project_in = nn.Linear(model.word_dim, model.hidden, bias=False)
        if model.learned_positions:
            self.position_embeddings = nn.Embedding(model.position_rows, model.hidden)
        if model.embedding_norm:
            self.embedding_layernorm = norm(model, model.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] -> hidden [s, b, h]."""
        x = self.word_embeddings(tokens)
        if self.model.pad_token >= 0:  # Hugging Face's padding_idx: the row is used, never trained
            x = torch.where((tokens == self.model.pad_token).unsqueeze(-1), x.detach(), x)
        if self.model.embedding_multiplier != 1:  # rounded to the compute dtype, as transformers' Gemma
            x = x * torch.tensor(self.model.embedding_multiplier, dtype=x.dtype).item()
        if self.model.projected:
            x = self.project_in(x)
        if self.model.learned_positions:
            positions = torch.arange(tokens.size(1), device=tokens.device) + self.model.position_offset
            x = x + self.position_embeddings(positions)
        if self.model.embedding_norm:
            x = self.embedding_layernorm(x)
        return x.transpose(0, 1).contiguous()


class Block(nn.Module):
    """Self-attention and MLP, each in a residual: x + f(norm(x)), or with
    post-norm (OPT-350m) norm(x + f(x)), or side by side (GPT-NeoX's parallel
    residual) x + attn(norm1(x)) + mlp(norm2(x)) (Cohere: one norm for both), or with sandwich norms
    (Gemma 2, 3) x + norm2(f(norm1(x))), or (OLMo 2) x + norm(f(x)); Granite scales each branch,
    x + m * f(norm(x))."""

    def __init__(self, spec: StageSpec, config: TransformerConfig, pg: ProcessGroupCollection, layer_number: int):
        super().__init__()
        model = spec.model
        self.post_norm, self.parallel_residual, self.shared_norm = model.post_norm, model.parallel_residual, \
            model.shared_norm
        self.residual_multiplier = model.residual_multiplier
        if model.input_norms:
            self.input_layernorm = norm(model, model.hidden)
        head_norm = (PostRotaryRMSNorm if model.qk_norm_after_rotary else HeadOffsetRMSNorm if model.norm_offset
                     else HeadRMSNorm) if model.qk_norm and not (model.qk_norm_full or model.qk_norm_per_head) else None
        attention = SelfAttentionSubmodules(
            linear_qkv=clipped(with_bias(ColumnParallelLinear, model.qkv_bias), model.qkv_clip),
            core_attention=FusedCoreAttention,
            linear_proj=with_bias(RowParallelLinear, model.out_bias), q_layernorm=head_norm, k_layernorm=head_norm)
        if model.local_rope_theta and model.window(layer_number - 1):  # rotary positions of their own, unscaled
            config = copy.copy(config)
            config.sailor_rope_mscale = 1.0
        if model.query_scale_nope and model.rotary(layer_number - 1):  # (Llama 4 scales q on its NoPE blocks alone)
            config = copy.copy(config)
            config.sailor_query_scale = (0.0, 0, 0)
        self.linear = model.linear(layer_number - 1)
        if self.linear:
            self.linear_attention = GatedDeltaNet(model, config, pg.tp)
        elif model.latent:
            self.self_attention = LatentAttention(model, config, functools.partial(norm, model), layer_number, pg.tp)
        else:
            self.self_attention = SelfAttention(config, attention, layer_number, attn_mask_type=AttnMaskType.causal,
                                                pg_collection=pg)
        # (megatron calls q_layernorm(query [s, b, heads, head_dim]) where set)
        if model.qk_norm_after_rotary:
            self.self_attention.core_attention.post_rotary_norms = (self.self_attention.q_layernorm,
                                                                    self.self_attention.k_layernorm)
        if model.alibi:  # (this rank's heads' slopes)
            local = model.heads // spec.tp
            self.self_attention.core_attention.alibi_slopes = \
                alibi_slopes(model.heads)[spec.tp_rank * local:(spec.tp_rank + 1) * local]
        if model.qk_norm_full and not self.linear:
            self.self_attention.q_layernorm = WidthRMSNorm(model.q_dim, spec.tp, model.norm_eps, pg.tp)
            self.self_attention.k_layernorm = WidthRMSNorm(model.kv_dim, spec.tp, model.norm_eps, pg.tp)
        elif model.qk_norm_per_head and not self.linear:
            self.self_attention.q_layernorm, self.self_attention.k_layernorm = (
                PerHeadNorm(heads // spec.tp, model.head_dim, model.rms_norm, model.norm_eps)
                for heads in (model.heads, model.num_query_groups))
        elif model.qk_l2_norm and model.rotary(layer_number - 1):  # (Llama 4's, after rotary positions: the same,
            # as turning pairs of dimensions keeps each head's RMS)
            self.self_attention.q_layernorm = self.self_attention.k_layernorm = HeadL2Norm(model.norm_eps)
        if model.input_norms and not model.shared_norm:
            self.pre_mlp_layernorm = norm(model, model.hidden)
        if model.experts and not model.dense(layer_number - 1):
            self.mlp = MoE(model, spec.tp, pg.tp, ACTIVATIONS[model.activation], spec.moe_aux_loss_coeff,
                           spec.moe_z_loss_coeff, spec.tp_rank, spec.moe_count_loads)
        else:
            mlp = MLPSubmodules(linear_fc1=with_bias(ColumnParallelLinear, model.mlp_bias),
                                linear_fc2=with_bias(RowParallelLinear, model.mlp_bias))
            if model.dense(layer_number - 1):  # DeepSeek's dense blocks (megatron's fc2 reads the config's width)
                config = copy.copy(config)
                config.ffn_hidden_size = model.dense_ffn
            self.mlp = MLP(config, mlp, ffn_hidden_size=config.ffn_hidden_size, tp_group=pg.tp)
            if model.activation == "xielu":  # (megatron's MLP applies activation_func to fc1's output)
                self.mlp.activation_func = XIELU()
        if model.sandwich_norm:
            self.post_attention_layernorm = norm(model, model.hidden)
            self.post_mlp_layernorm = norm(model, model.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rotary: torch.Tensor | None) -> torch.Tensor:
        h = self._input(x, "input_layernorm")
        attention = self.linear_attention if self.linear else self.self_attention
        out, bias = attention(h, attention_mask=mask, rotary_pos_emb=rotary)
        if self.parallel_residual:  # the MLP reads the block's input too, not the attention's output
            mlp, mlp_bias = self.mlp(h if self.shared_norm else self.pre_mlp_layernorm(x))
            return x + self._branch(out if bias is None else out + bias) + \
                self._branch(mlp if mlp_bias is None else mlp + mlp_bias)
        x = x + self._branch(out if bias is None else out + bias, "post_attention_layernorm")
        if self.post_norm:
            x = self.input_layernorm(x)
        out, bias = self.mlp(self._input(x, "pre_mlp_layernorm"))
        x = x + self._branch(out if bias is None else out + bias, "post_mlp_layernorm")
        return self.pre_mlp_layernorm(x) if self.post_norm else x

    def _input(self, x: torch.Tensor, norm_name: str) -> torch.Tensor:
        """A sublayer's input: x normalised by its pre-norm, or x itself (post-norm blocks; OLMo 2)."""
        return x if self.post_norm or not hasattr(self, norm_name) else getattr(self, norm_name)(x)

    def _branch(self, out: torch.Tensor, post_norm: str | None = None) -> torch.Tensor:
        """A sublayer's output as the residual adds it: normalised (sandwich norms), scaled (Granite)."""
        if post_norm is not None and hasattr(self, post_norm):
            out = getattr(self, post_norm)(out)
        return out * self.residual_multiplier if self.residual_multiplier != 1 else out


class FinalNorm(nn.Module):
    """The final norm as a pipeline layer of its own (LLaMA's numbering)."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.final_layernorm = norm(model, model.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_layernorm(x)


class Head(nn.Module):
    """Final norm, projection to the embedding width, vocabulary-parallel output layer (with Phi's bias; then
    Granite's logits divisor and Gemma 2's cap on the logits, c * tanh(logits / c))."""

    def __init__(self, spec: StageSpec, config: TransformerConfig, tp_group, reuse_embedding: bool):
        super().__init__()
        model = spec.model
        self.model = model
        if model.final_norm and not model.separate_final_norm:
            self.final_layernorm = norm(model, model.hidden)
        if model.projected:
            self.project_out = nn.Linear(model.hidden, model.word_dim, bias=False)
        self.output_layer = ColumnParallelLinear(
            model.word_dim, spec.padded_vocab, config=config, init_method=None, bias=model.head_bias,
            gather_output=False, skip_bias_add=False, skip_weight_param_allocation=reuse_embedding,
            tp_group=tp_group)

    def forward(self, hidden: torch.Tensor, embedding_weight: torch.Tensor | None = None) -> torch.Tensor:
        """embedding_weight: the word embedding, when the head reuses it on this stage."""
        if hasattr(self, "final_layernorm"):
            hidden = self.final_layernorm(hidden)
        if self.model.projected:
            hidden = self.project_out(hidden)
        logits, _ = self.output_layer(hidden, weight=embedding_weight)
        if self.model.logits_divisor != 1:
            logits = logits / self.model.logits_divisor
        if self.model.logit_softcap:
            cap = self.model.logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits


class StageModel(nn.Module):
    """The layers of one pipeline stage on one TP rank.

    forward(first stage: tokens [b, s]; others: hidden [s, b, h]) returns the
    hidden state [s, b, h], or on the last stage the logits [s, b, V/tp].
    """

    def __init__(self, spec: StageSpec, tp_group: dist.ProcessGroup, device: torch.device,
                 fusion: KernelFusion | None = None):
        """fusion: default KernelFusion.default(device)."""
        super().__init__()
        self.spec = spec
        self.tp_group = tp_group
        model = spec.model
        config = transformer_config(model, spec.tp, fusion or KernelFusion.default(device))
        pg = ProcessGroupCollection(tp=tp_group, pp=None, cp=compat.NO_CONTEXT_PARALLEL)  # our schedule does PP
        self.layers = nn.ModuleDict()
        for layer in spec.layers:
            kind = model.kind(layer)
            if kind == EMBEDDING:
                self.layers[str(layer)] = Embedding(spec, config, tp_group)
            elif kind == BLOCK:
                self.layers[str(layer)] = Block(spec, config, pg, layer)
            elif kind == FINAL_NORM:
                self.layers[str(layer)] = FinalNorm(model)
            else:
                reuse = model.tied_embeddings and "0" in self.layers
                self.layers[str(layer)] = Head(spec, config, tp_group, reuse)
        self.shards = self._shards()
        self.to(device)
        self.device = device
        self._masks: dict[tuple[int, int], torch.Tensor | None] = {}
        self._rotary: dict[tuple[int, bool], torch.Tensor] = {}

    @property
    def moe_layers(self) -> list[MoE]:
        return [m.mlp for m in self.layers.values() if isinstance(m, Block) and isinstance(m.mlp, MoE)]

    def take_router_sums(self) -> torch.Tensor:
        """The step's sums of sequence balances and of token z values over this stage's MoE blocks [2]
        (float64, on the device); resets them."""
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for moe in self.moe_layers:
            total, moe.router_sums = total + moe.router_sums, 0.0
        return total

    def take_expert_loads(self) -> dict[int, torch.Tensor]:
        """The step's tokens per expert [E] (float64, on the device) of this stage's MoE blocks, by block
        (0-based); resets them."""
        loads = {}
        for layer, module in self.layers.items():
            if isinstance(module, Block) and isinstance(module.mlp, MoE) and module.mlp.count_loads:
                loads[int(layer) - 1], module.mlp.expert_load = module.mlp.expert_load, 0.0
        return loads

    @property
    def vocab_start(self) -> int:
        return self.spec.padded_vocab // self.spec.tp * self.spec.tp_rank

    def mask(self, block: int, seq_len: int) -> torch.Tensor | None:
        """Block `block`'s (1-based) attention mask; None for plain causal attention."""
        model = self.spec.model
        window = model.window(block - 1)
        window = window if window < seq_len else 0
        chunk = model.attention_chunk if model.attention_chunk < seq_len and model.rotary(block - 1) else 0
        if not window and not chunk:
            return None
        key = (window, chunk, seq_len)
        if key not in self._masks:
            self._masks[key] = window_mask(seq_len, window, self.device, chunk)
        return self._masks[key]

    def rotary(self, block: int, seq_len: int) -> torch.Tensor | None:
        """Block `block`'s (1-based) rotary angles; None with learned positions or none (NoPE and linear-attention
        blocks)."""
        model = self.spec.model
        if not model.rotary(block - 1):
            return None
        local = bool(model.local_rope_theta and model.window(block - 1))  # Gemma 3's windowed blocks
        if (seq_len, local) not in self._rotary:
            self._rotary[(seq_len, local)] = rotary_embedding(model, seq_len, self.device, local)
        return self._rotary[(seq_len, local)]

    def run_layer(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """One layer's forward (the profiler times them one by one)."""
        module = self.layers[str(layer)]
        if isinstance(module, Block):
            args = (module, x, self.mask(layer, x.size(0)), self.rotary(layer, x.size(0)))
            if self.spec.recompute and torch.is_grad_enabled():
                return checkpoint(_block_output, *args, use_reentrant=False)
            return _block_output(*args)
        if isinstance(module, Head):
            tied = module.output_layer.weight is None
            return module(x, self.layers["0"].word_embeddings.weight if tied else None)
        return module(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.spec.layers:
            x = self.run_layer(layer, x)
        return x

    # -- logical tensors ---------------------------------------------------------
    def _shards(self) -> dict[str, ParamShard]:
        """ParamShard of every local parameter, from the megatron module types."""
        spec, out = self.spec, {}
        for module_name, module in self.named_modules():
            for pname, param in module.named_parameters(recurse=False):
                name = f"{module_name}.{pname}"
                dim = None
                if isinstance(module, ExpertWeights):
                    dim = module.partition_dim if pname == "weight" else module.bias_dim
                elif isinstance(module, (WidthRMSNorm, PerHeadNorm, FusedCoreAttention, ShortConv, GatedDeltaNet)):
                    # split with the heads (OLMo 2's and Command R+'s q/k norm weights, gpt-oss's sinks, Gated
                    # DeltaNet's convolution taps, decay rates and step biases)
                    dim = 0
                elif isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
                    dim = 0  # output features / vocabulary rows (weight and bias)
                elif isinstance(module, RowParallelLinear) and pname == "weight":
                    dim = 1  # input features; the bias is added after the all-reduce
                logical, stages, chunks = name, (spec.stage,), spec.stage_chunks
                is_word = isinstance(module, VocabParallelEmbedding) or module_name.endswith("output_layer")
                if is_word and spec.model.tied_embeddings:
                    # one logical tensor, held by the first and the last stage
                    logical, stages, chunks = WORD_EMBEDDING, spec.embedding_stages, spec.embedding_chunks
                shape = list(param.shape)
                if dim is not None:
                    shape[dim] *= spec.tp
                if isinstance(module, ExpertWeights):
                    shape = list(module.logical_shape if pname == "weight" else module.bias_shape)
                elif dim is not None and spec.model.gated_mlp and module_name.endswith("mlp.linear_fc1"):
                    # megatron's SwiGLU fc1: each TP rank holds [its gate rows; its up rows], so the
                    # logical tensor is [2, ffn, ...] split along dim 1
                    shape = [2, shape[0] // 2, *shape[1:]]
                    dim = 1
                partial = dim is None and (isinstance(module, ExpertWeights) or module_name.endswith(
                    ("self_attention.q_layernorm", "self_attention.k_layernorm", "mlp.router", "mlp.shared_gate",
                     "linear_attention.out_norm", "mlp.activation_func")))
                out[name] = ParamShard(logical, tuple(shape), dim, spec.tp, spec.tp_rank,
                                       chunks if dim is not None else 1, stages, partial_grad=partial)
        return out


def _block_output(block: Block, x: torch.Tensor, mask: torch.Tensor | None, rotary: torch.Tensor | None):
    return block(x, mask, rotary)


def init_tensor(name: str, shape: tuple[int, ...], seed: int, num_blocks: int,
                norm_offset: bool = False) -> torch.Tensor:
    """The full logical tensor `name`, drawn from its own seeded generator (norms scale by 1: a
    weight of 1, or of 0 where they scale by 1 + w)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("bias", "score_bias"):
        return torch.zeros(shape)
    if ".activation_func." in name:  # xIELU's scalars
        return torch.full(shape, XIELU_INIT[leaf])
    if "layernorm" in name:
        return torch.zeros(shape) if norm_offset else torch.ones(shape)
    if name.endswith("out_norm.weight"):  # Gated DeltaNet's output norm scales by w, whatever the model's norms
        return torch.ones(shape)
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    if leaf == "A_log":  # Gated DeltaNet's decay rates A, uniform in [1, 16] (Mamba-2's initialisation)
        return torch.empty(shape).uniform_(1, 16, generator=generator).log()
    if leaf == "dt_bias":  # its steps dt = softplus(dt_bias), log-uniform in [1e-3, 0.1] (Mamba-2's)
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(0.1), generator=generator).exp()
        return dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)
    std = INIT_STD
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        std = INIT_STD / math.sqrt(2.0 * num_blocks)  # megatron's scaled init for output projections
    return torch.randn(shape, generator=generator) * std


@torch.no_grad()
def init_from_seed(stage: StageModel, seed: int) -> None:
    """Give every local parameter its slice of the seeded logical tensor."""
    for name, param in stage.named_parameters():
        shard = stage.shards[name]
        model = stage.spec.model
        full = init_tensor(shard.name, shard.logical_shape, seed, model.num_blocks, model.norm_offset)
        shard.view(param).copy_(shard.shard_of(full))
