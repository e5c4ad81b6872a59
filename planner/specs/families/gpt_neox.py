"""GPT-NeoX and Pythia (model_type gpt_neox): rotary positions on a share of each head, LayerNorm
with biases, a GELU MLP, and (use_parallel_residual) attention and MLP side by side on the same
input: x + attn(ln1(x)) + mlp(ln2(x)).

The fused query_key_value tensor holds, head after head, [q_h; k_h; v_h]: megatron's own layout of
a fused QKV for multi-head attention (one query group per head), so it is copied as it is.
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.inputs import FLOAT_MAX, short
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.model import MAX_BLOCKS, ModelSpec


def _rotary(cfg) -> tuple[float, float]:
    """(theta, share of each head rotated): rope_parameters (transformers 5) or rotary_emb_base and
    rotary_pct (older configs)."""
    params = cfg.cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise SailorError(f"model config {cfg.source}: rope_parameters must be an object, not {short(params)}")
    params = params or {}
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise SailorError(f"model config {cfg.source}: rope type {short(kind)} is not supported for gpt_neox; use "
                          "default")
    theta = params.get("rope_theta", cfg.cfg.get("rotary_emb_base", 10000.0))
    fraction = params.get("partial_rotary_factor", cfg.cfg.get("rotary_pct", 0.25))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta <= FLOAT_MAX:
        raise SailorError(f"model config {cfg.source}: rope_theta must be a positive number, not {short(theta)}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise SailorError(f"model config {cfg.source}: rotary_pct must be above 0 and at most 1, not "
                          f"{short(fraction)}")
    return float(theta), float(fraction)


def from_hf(cfg, model_type: str) -> dict:
    theta, fraction = _rotary(cfg)
    bias = cfg.bool("attention_bias", True)
    return dict(
        hidden=cfg.int("hidden_size"), num_blocks=cfg.int("num_hidden_layers", hi=MAX_BLOCKS),
        heads=cfg.int("num_attention_heads"), ffn_hidden=cfg.int("intermediate_size"), vocab=cfg.int("vocab_size"),
        max_positions=cfg.int("max_position_embeddings"), tied_embeddings=cfg.bool("tie_word_embeddings", False),
        learned_positions=False, qkv_bias=bias, out_bias=bias, mlp_bias=True,
        activation=cfg.activation("hidden_act", "gelu"), norm_eps=cfg.float("layer_norm_eps", 1e-5),
        rope_theta=theta, rotary_fraction=fraction, parallel_residual=cfg.bool("use_parallel_residual", True),
        pad_token=cfg.pad_token(None),
    )


def to_hf(spec: ModelSpec) -> dict:
    if spec.rms_norm or spec.gated_mlp or spec.learned_positions or spec.windows or spec.projected or spec.post_norm \
            or spec.qkv_bias != spec.out_bias or not spec.mlp_bias or spec.kv_heads not in (0, spec.heads) \
            or spec.head_dim_override or spec.separate_final_norm or spec.attention_scale or spec.rope_scaling \
            or spec.qk_norm:
        raise SailorError(f"{spec.name} cannot be written as a GPT-NeoX config: its layers differ from GPT-NeoX's")
    return {
        "model_type": "gpt_neox", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "layer_norm_eps": spec.norm_eps,
        "hidden_act": ACTIVATION_TO_HF[spec.activation], "attention_bias": spec.qkv_bias,
        "use_parallel_residual": spec.parallel_residual, "tie_word_embeddings": spec.tied_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta,
                            "partial_rotary_factor": spec.rotary_fraction},
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
    }


_LAYER = "gpt_neox.layers.{i}."
WEIGHTS = WeightMap(
    embedding=(WeightRule("word_embeddings.weight", ("gpt_neox.embed_in.weight",), "vocab"),),
    block=(
        *(WeightRule(f"input_layernorm.{p}", (_LAYER + f"input_layernorm.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"self_attention.linear_qkv.{p}", (_LAYER + f"attention.query_key_value.{p}",))
          for p in ("weight", "bias")),
        *(WeightRule(f"self_attention.linear_proj.{p}", (_LAYER + f"attention.dense.{p}",))
          for p in ("weight", "bias")),
        *(WeightRule(f"pre_mlp_layernorm.{p}", (_LAYER + f"post_attention_layernorm.{p}",))
          for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc1.{p}", (_LAYER + f"mlp.dense_h_to_4h.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc2.{p}", (_LAYER + f"mlp.dense_4h_to_h.{p}",)) for p in ("weight", "bias")),
    ),
    final_norm=(),
    head=(
        *(WeightRule(f"final_layernorm.{p}", (f"gpt_neox.final_layer_norm.{p}",)) for p in ("weight", "bias")),
        WeightRule("output_layer.weight", ("embed_out.weight",), "vocab"),
    ),
)

FAMILY = Family("gpt-neox", ("gpt_neox",), from_hf, to_hf, WEIGHTS)
