"""Cohere (model_type cohere: Command R, Aya Expanse): attention and a SwiGLU MLP side by side on
one shared LayerNorm without bias, x + attn(norm(x)) + mlp(norm(x)); rotary positions on adjacent
pairs of dimensions (interleaved); the logits multiplied by logit_scale; the head tied to the
embedding by default. Cohere 2 (model_type cohere2: Command R7B, Command A) windows three blocks
in four (layer_types, or sliding_window_pattern) and gives rotary positions to the windowed blocks
only: its full-attention blocks have none (NoPE). Command R+ (use_qk_norm) normalises each head's q and k
with a LayerNorm without bias before the rotary positions, each head with a weight of its own
(ModelSpec.qk_norm_per_head; transformers' q_norm and k_norm weights [heads, head_dim]).
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family
from planner.specs.families import llama
from planner.specs.model import MAX_BLOCKS, ModelSpec


def _cohere2_blocks(cfg, blocks: int) -> dict:
    """Cohere 2's windows and NoPE blocks: windowed blocks rotate, full ones do not (with no sliding_window, no
    block rotates, as transformers applies rotary positions only where it sets a window)."""
    layer_types = cfg.cfg.get("layer_types")
    if layer_types is None:
        layer_types = llama.every_nth_full(blocks, cfg.int("sliding_window_pattern", 4))
    llama.check_layer_types(cfg, layer_types, blocks)
    if not cfg.has("sliding_window"):
        return dict(windows=(), nope_blocks=tuple(range(blocks)))
    width = cfg.int("sliding_window")
    windows = tuple(width if t == "sliding_attention" else 0 for t in layer_types)
    return dict(windows=windows if any(windows) else (), nope_blocks=tuple(i for i, w in enumerate(windows) if not w))


def from_hf(cfg, model_type: str) -> dict:
    qk_norm = model_type == "cohere" and cfg.bool("use_qk_norm", False)  # (Cohere 2 has no such field)
    heads, hidden = cfg.int("num_attention_heads"), cfg.int("hidden_size")
    kv_heads = cfg.int("num_key_value_heads", heads)
    head_dim = cfg.int("head_dim") if cfg.has("head_dim") else 0  # (transformers reads it; else hidden / heads)
    bias = cfg.bool("attention_bias", False)
    theta, scaling = llama._rope(cfg)
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)
    return dict(
        hidden=hidden, num_blocks=blocks, heads=heads, head_dim_override=0 if head_dim * heads == hidden else head_dim,
        ffn_hidden=cfg.int("intermediate_size"), vocab=cfg.int("vocab_size"),
        max_positions=cfg.int("max_position_embeddings"), kv_heads=0 if kv_heads == heads else kv_heads,
        tied_embeddings=cfg.bool("tie_word_embeddings", True), gated_mlp=True, learned_positions=False,
        qkv_bias=bias, out_bias=bias, mlp_bias=False, separate_final_norm=True, norm_bias=False,
        parallel_residual=True, shared_norm=True, rotary_interleaved=True,
        activation=cfg.activation("hidden_act", "silu"), norm_eps=cfg.float("layer_norm_eps", 1e-5),
        logits_divisor=1.0 / cfg.float("logit_scale", 0.0625), rope_theta=theta, rope_scaling=scaling,
        pad_token=cfg.pad_token(0), qk_norm=qk_norm, qk_norm_per_head=qk_norm,
        **(_cohere2_blocks(cfg, blocks) if model_type == "cohere2" else {}),
    )


def to_hf(spec: ModelSpec) -> dict:
    model_type = spec.hf_model_type or "cohere"
    windowed = [i for i in range(spec.num_blocks) if spec.window(i)]
    cohere2 = model_type == "cohere2" and len({w for w in spec.windows if w}) <= 1 and \
        spec.nope_blocks == tuple(i for i in range(spec.num_blocks) if i not in windowed)
    if spec.rms_norm or spec.norm_bias or not (spec.parallel_residual and spec.shared_norm and
                                               spec.rotary_interleaved and spec.gated_mlp) or \
            spec.learned_positions or spec.projected or \
            spec.attention_scale or spec.qk_norm != spec.qk_norm_per_head or spec.qk_norm_full or \
            (spec.qk_norm and model_type == "cohere2") or spec.mlp_bias or spec.qkv_bias != spec.out_bias or \
            spec.rotary_fraction != 1 or spec.embedding_multiplier != 1 or spec.residual_multiplier != 1 or \
            ((spec.windows or spec.nope_blocks) and not cohere2):
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: its layers differ from "
                          f"{model_type}'s")
    extra = {}
    if model_type == "cohere2":
        extra = {"layer_types": ["sliding_attention" if spec.window(i) else "full_attention"
                                 for i in range(spec.num_blocks)],
                 "sliding_window": spec.window(windowed[0]) if windowed else None}
    return {
        **extra, "model_type": model_type, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups, "head_dim": spec.head_dim,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "layer_norm_eps": spec.norm_eps,
        "hidden_act": ACTIVATION_TO_HF[spec.activation], "attention_bias": spec.qkv_bias,
        "logit_scale": 1.0 / spec.logits_divisor, "rope_parameters": llama.hf_rope(spec),
        "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        **({} if model_type == "cohere2" else {"use_qk_norm": spec.qk_norm}),
    }


# LLaMA's tensor names (the pre-MLP norm's rule goes unused: the shared norm is input_layernorm)
FAMILY = Family("cohere", ("cohere", "cohere2"), from_hf, to_hf, llama.WEIGHTS)
