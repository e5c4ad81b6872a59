"""Phi-3 and Phi-4 (model_type phi3): LLaMA's block with its weights fused.

The attention's q, k and v projections are one tensor ([q; k; v] rows:
`qkv_proj`) and the MLP's gate and up projections are one ([gate; up] rows:
`gate_up_proj`); no biases; RMSNorm, SwiGLU, rotary positions, possibly on a
share of each head's dimensions only (`partial_rotary_factor`) and a sliding
window on every block. The config has no head dimension of its own (hidden
size / heads). Long-context variants (Phi-3-*-128k, Phi-3.5, Phi-4-mini) scale
each rotary frequency by its own factor (rope type longrope, llama._longrope).
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.families import llama
from planner.specs.model import ModelSpec


def rotary_fraction(cfg, default: float = 1.0) -> float:
    """partial_rotary_factor, in rope_parameters (transformers 5) or beside it (older configs)."""
    params = cfg.cfg.get("rope_parameters")
    value = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    if value is None:
        value = cfg.cfg.get("partial_rotary_factor", default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise SailorError(f"model config {cfg.source}: partial_rotary_factor must be above 0 and at most 1, not "
                          f"{short(value)}")
    return float(value)


def from_hf(cfg, model_type: str) -> dict:
    fields = llama.from_hf(cfg, model_type)  # the same fields, read the same way
    if fields["head_dim_override"]:
        raise SailorError(f"model config {cfg.source}: phi3 takes its head dimension from hidden_size / "
                          "num_attention_heads; remove head_dim")
    return {**fields, "rotary_fraction": rotary_fraction(cfg)}


def to_hf(spec: ModelSpec) -> dict:
    if spec.qkv_bias or spec.out_bias or spec.mlp_bias or spec.head_dim_override or spec.qk_norm:
        raise SailorError(f"{spec.name}: phi3's config cannot express biases, a head dimension of its own or q/k "
                          "norms")
    windows = {w for w in spec.windows if w}
    if len(windows) > 1 or (windows and 0 in spec.windows):
        raise SailorError(f"{spec.name}: phi3's config has one sliding window for every block, not "
                          f"{sorted(set(spec.windows))}")
    rope = {**llama.hf_rope(spec), "partial_rotary_factor": spec.rotary_fraction}
    if rope["rope_type"] not in ("default", "longrope"):
        raise SailorError(f"{spec.name}: phi3's config cannot express rotary scaling {rope['rope_type']}")
    original = rope.get("original_max_position_embeddings", spec.context_length)
    return {
        "model_type": "phi3", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "original_max_position_embeddings": original,
        "rms_norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation], "rope_parameters": rope,
        "tie_word_embeddings": spec.tied_embeddings, "sliding_window": windows.pop() if windows else None,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
    }


_LAYER = "model.layers.{i}."
WEIGHTS = WeightMap(
    embedding=(WeightRule("word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),),
    block=(
        WeightRule("input_layernorm.weight", (_LAYER + "input_layernorm.weight",)),
        WeightRule("self_attention.linear_qkv.weight", (_LAYER + "self_attn.qkv_proj.weight",), "qkv_cat"),
        WeightRule("self_attention.linear_proj.weight", (_LAYER + "self_attn.o_proj.weight",)),
        WeightRule("pre_mlp_layernorm.weight", (_LAYER + "post_attention_layernorm.weight",)),
        WeightRule("mlp.linear_fc1.weight", (_LAYER + "mlp.gate_up_proj.weight",), "gate_up_cat"),
        WeightRule("mlp.linear_fc2.weight", (_LAYER + "mlp.down_proj.weight",)),
    ),
    final_norm=(WeightRule("final_layernorm.weight", ("model.norm.weight",)),),
    head=(WeightRule("output_layer.weight", ("lm_head.weight",), "vocab"),),
)

FAMILY = Family("phi3", ("phi3",), from_hf, to_hf, WEIGHTS)
