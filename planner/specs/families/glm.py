"""GLM-4 (model_type glm: GLM-4-9B-chat-hf) and GLM-4-0414 (glm4: GLM-4-9B/32B-0414, GLM-Z1).

LLaMA's block with q/k/v biases (attention_bias, on by default) and none on the output projection,
rotary positions on adjacent pairs of dimensions (interleaved) of the first half of each head
(partial_rotary_factor, 0.5 by default), the MLP's gate and up projections in one tensor
(`gate_up_proj`) and heads of 128 unless the config says otherwise. GLM-4-0414 normalises each
sublayer's output too (sandwich norms: `post_self_attn_layernorm`, `post_mlp_layernorm`).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightRule
from planner.specs.families import llama, phi3
from planner.specs.model import ModelSpec

HEAD_DIM = 128  # transformers' default for both


def from_hf(cfg, model_type: str) -> dict:
    fields = llama.from_hf(cfg, model_type)  # heads, widths, rotary base and scaling, windows (none), read alike
    heads, hidden = fields["heads"], fields["hidden"]
    head_dim = cfg.int("head_dim", HEAD_DIM)
    return {**fields, "qkv_bias": cfg.bool("attention_bias", True), "out_bias": False, "mlp_bias": False,
            "head_dim_override": head_dim if head_dim * heads != hidden else 0, "rotary_interleaved": True,
            "rotary_fraction": phi3.rotary_fraction(cfg, 0.5), "sandwich_norm": model_type == "glm4"}


def to_hf(spec: ModelSpec) -> dict:
    model_type = spec.hf_model_type or ("glm4" if spec.sandwich_norm else "glm")
    if spec.out_bias or spec.mlp_bias or spec.qk_norm or spec.windows or spec.nope_blocks or \
            not spec.rotary_interleaved or spec.sandwich_norm != (model_type == "glm4"):
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: its layers differ from "
                          f"{model_type}'s")
    return {
        "model_type": model_type, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "head_dim": spec.head_dim,
        "max_position_embeddings": spec.context_length, "rms_norm_eps": spec.norm_eps,
        "hidden_act": ACTIVATION_TO_HF[spec.activation], "attention_bias": spec.qkv_bias,
        "rope_parameters": {**llama.hf_rope(spec), "partial_rotary_factor": spec.rotary_fraction},
        "tie_word_embeddings": spec.tied_embeddings, "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
    }


_LAYER = "model.layers.{i}."
# LLaMA's tensors with gate and up in one (Phi-3's gate_up_cat), and GLM-4-0414's output norms
WEIGHTS = replace(llama.WEIGHTS, block=tuple(
    WeightRule(r.ours, (_LAYER + "mlp.gate_up_proj.weight",), "gate_up_cat") if r.ours == "mlp.linear_fc1.weight"
    else r for r in llama.WEIGHTS.block) + (
    WeightRule("post_attention_layernorm.weight", (_LAYER + "post_self_attn_layernorm.weight",)),
    WeightRule("post_mlp_layernorm.weight", (_LAYER + "post_mlp_layernorm.weight",))))

FAMILY = Family("glm", ("glm", "glm4"), from_hf, to_hf, WEIGHTS)
