"""Phi (model_type phi: phi-1, phi-1.5, phi-2): attention and a GELU MLP side by side on one shared
LayerNorm, x + attn(norm(x)) + mlp(norm(x)); biases on every linear, the output layer's included
(ModelSpec.head_bias); rotary positions on the leading share of each head (partial_rotary_factor, 0.5
by default); the final LayerNorm in the head.

Refused: qk_layernorm (LayerNorms with biases over each head's q and k, shared by the heads).
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule, llama
from planner.specs.model import MAX_BLOCKS, ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    if cfg.bool("qk_layernorm", False):
        raise SailorError(f"model config {cfg.source}: qk_layernorm (LayerNorms over q and k) is not supported for "
                          "phi; set it to false")
    theta, scaling = llama._rope(cfg)  # (checks that rope_scaling and rope_parameters are objects)
    # as transformers reads it: from the rope fields it reads (llama._rope), else the top-level field, else 0.5
    params = cfg.cfg.get("rope_scaling") or cfg.cfg.get("rope_parameters") or {}
    fraction = params.get("partial_rotary_factor", cfg.cfg.get("partial_rotary_factor", 0.5))
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise SailorError(f"model config {cfg.source}: partial_rotary_factor must be above 0 and at most 1, not "
                          f"{short(fraction)}")
    heads, hidden = cfg.int("num_attention_heads"), cfg.int("hidden_size")
    kv_heads = cfg.int("num_key_value_heads", heads)
    head_dim = cfg.int("head_dim") if cfg.has("head_dim") else 0  # (transformers reads it; else hidden / heads)
    return dict(
        hidden=hidden, head_dim_override=0 if head_dim * heads == hidden else head_dim,
        num_blocks=cfg.int("num_hidden_layers", hi=MAX_BLOCKS), heads=heads,
        ffn_hidden=cfg.int("intermediate_size"), vocab=cfg.int("vocab_size"),
        max_positions=cfg.int("max_position_embeddings"), kv_heads=0 if kv_heads == heads else kv_heads,
        tied_embeddings=cfg.bool("tie_word_embeddings", False), learned_positions=False, qkv_bias=True,
        out_bias=True, mlp_bias=True, head_bias=True, parallel_residual=True, shared_norm=True,
        activation=cfg.activation("hidden_act", "gelu_new"), norm_eps=cfg.float("layer_norm_eps", 1e-5),
        rope_theta=theta, rope_scaling=scaling, rotary_fraction=float(fraction), pad_token=cfg.pad_token(None),
    )


def to_hf(spec: ModelSpec) -> dict:
    if spec.rms_norm or not spec.norm_bias or spec.gated_mlp or spec.learned_positions or spec.windows or \
            spec.projected or spec.post_norm or not (spec.qkv_bias and spec.out_bias and spec.mlp_bias and
                                                     spec.head_bias and spec.parallel_residual and spec.shared_norm) \
            or spec.separate_final_norm or spec.attention_scale or spec.qk_norm or \
            spec.rotary_interleaved or spec.experts or spec.nope_blocks:
        raise SailorError(f"{spec.name} cannot be written as a phi config: its layers differ from Phi's")
    return {
        "model_type": "phi", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "max_position_embeddings": spec.context_length,
        "head_dim": spec.head_dim,
        "layer_norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation],
        "rope_parameters": {**llama.hf_rope(spec), "partial_rotary_factor": spec.rotary_fraction},
        "tie_word_embeddings": spec.tied_embeddings, "qk_layernorm": False,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
    }


_LAYER = "model.layers.{i}."
WEIGHTS = WeightMap(
    embedding=(WeightRule("word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),),
    block=(
        *(WeightRule(f"input_layernorm.{p}", (_LAYER + f"input_layernorm.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"self_attention.linear_qkv.{p}", tuple(_LAYER + f"self_attn.{x}_proj.{p}" for x in "qkv"),
                     "qkv") for p in ("weight", "bias")),
        *(WeightRule(f"self_attention.linear_proj.{p}", (_LAYER + f"self_attn.dense.{p}",))
          for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc1.{p}", (_LAYER + f"mlp.fc1.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc2.{p}", (_LAYER + f"mlp.fc2.{p}",)) for p in ("weight", "bias")),
    ),
    final_norm=(),
    head=(*(WeightRule(f"final_layernorm.{p}", (f"model.final_layernorm.{p}",)) for p in ("weight", "bias")),
          *(WeightRule(f"output_layer.{p}", (f"lm_head.{p}",), "vocab") for p in ("weight", "bias"))),
)

FAMILY = Family("phi", ("phi",), from_hf, to_hf, WEIGHTS)
