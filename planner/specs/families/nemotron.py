"""Nemotron and Jais 2.

Nemotron (model_type nemotron: Nemotron-4 and Minitron, as transformers converts NVIDIA's checkpoints): LLaMA's
attention with half of each head rotated by default (partial_rotary_factor), a plain MLP up_proj -> ReLU squared
(relu2) -> down_proj, and LayerNorm1P: LayerNorms with biases that scale by (1 + w) (ModelSpec.norm_offset, kept as
w in the checkpoint). Biases on attention (attention_bias) and MLP (mlp_bias) as their fields say; untied by default.

Jais 2 (model_type jais2) is the same block with plain LayerNorms (w, not 1 + w), whole heads rotated, and biases on
attention and MLP by default.
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, arcee, llama, phi3, stablelm
from planner.specs.model import ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    jais = model_type == "jais2"
    return {**llama.from_hf(cfg, "llama"), "rms_norm": False, "norm_offset": not jais, "gated_mlp": False,
            "activation": cfg.activation("hidden_act", "relu2"),
            "norm_eps": cfg.float("layer_norm_eps" if jais else "norm_eps", 1e-5),
            "rotary_fraction": 1.0 if jais else phi3.rotary_fraction(cfg, 0.5)}


def to_hf(spec: ModelSpec) -> dict:
    jais = spec.family == JAIS2.name
    if spec.rms_norm or spec.norm_offset == jais or not spec.norm_bias or spec.gated_mlp or spec.qkv_bias != \
            spec.out_bias or spec.windows or spec.qk_norm or spec.parallel_residual or spec.learned_positions or \
            spec.projected or spec.post_norm or spec.rotary_interleaved or spec.experts or spec.nope_blocks or \
            spec.head_bias or spec.attention_scale or spec.sandwich_norm or (jais and spec.rotary_fraction != 1):
        raise SailorError(f"{spec.name} cannot be written as a {spec.family} config: its layers differ from "
                          f"{'Jais 2' if jais else 'Nemotron'}'s")
    rope = llama.hf_rope(spec)
    return {
        "model_type": spec.family, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups, "head_dim": spec.head_dim,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "max_position_embeddings": spec.context_length,
        "layer_norm_eps" if jais else "norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation],
        "rope_parameters": rope if jais else {**rope, "partial_rotary_factor": spec.rotary_fraction},
        "attention_bias": spec.qkv_bias, "mlp_bias": spec.mlp_bias, "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None, "attention_dropout": 0.0,
    }


# Arcee's tensors (LLaMA's, fc1 being up_proj alone) with the LayerNorms' biases
WEIGHTS = replace(arcee.WEIGHTS, block=(*arcee.WEIGHTS.block, *(r for r in stablelm.WEIGHTS.block
                                                               if r.ours.endswith("layernorm.bias"))),
                  final_norm=stablelm.WEIGHTS.final_norm)

FAMILY = Family("nemotron", ("nemotron",), from_hf, to_hf, WEIGHTS)
JAIS2 = Family("jais2", ("jais2",), from_hf, to_hf, WEIGHTS)
