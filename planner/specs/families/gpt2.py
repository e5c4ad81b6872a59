"""GPT-2: learned positions, tanh-GELU MLP, tied head; weights kept as
Conv1D ([in, out], the transpose of a Linear) with q, k, v in one tensor.

GPTBigCode (model_type gpt_bigcode: StarCoder, StarCoderBase, SantaCoder, WizardCoder) is GPT-2 with Linear
weights and, with multi_query (the default), one key/value head. Its fused c_attn is megatron's own layout either
way: [all q heads; k; v] for the one group, [q_h; k_h; v_h] head after head without multi_query."""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.model import MAX_BLOCKS, ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    if cfg.bool("scale_attn_by_inverse_layer_idx", False):
        raise SailorError(f"model config {cfg.source}: scale_attn_by_inverse_layer_idx is not supported")
    hidden = cfg.int("n_embd")
    return dict(
        hidden=hidden, num_blocks=cfg.int("n_layer", hi=MAX_BLOCKS), heads=cfg.int("n_head"),
        ffn_hidden=cfg.int("n_inner", 4 * hidden),
        vocab=cfg.int("vocab_size"), max_positions=cfg.int("n_positions"),
        tied_embeddings=cfg.bool("tie_word_embeddings", True), activation=cfg.activation("activation_function",
                                                                                          "gelu_new"),
        norm_eps=cfg.float("layer_norm_epsilon", 1e-5),
        attention_scale=0.0 if cfg.bool("scale_attn_weights", True) else 1.0,
    )


def to_hf(spec: ModelSpec) -> dict:
    if spec.rms_norm or spec.gated_mlp or not spec.learned_positions or spec.windows or spec.projected \
            or spec.post_norm or not (spec.qkv_bias and spec.out_bias and spec.mlp_bias) or spec.position_offset \
            or spec.kv_heads not in (0, spec.heads) or spec.head_dim_override or spec.separate_final_norm \
            or spec.attention_scale not in (0.0, 1.0):
        raise SailorError(f"{spec.name} cannot be written as a GPT-2 config: its layers differ from GPT-2's")
    return {
        "model_type": "gpt2", "n_embd": spec.hidden, "n_layer": spec.num_blocks, "n_head": spec.heads,
        "n_inner": spec.ffn_hidden, "vocab_size": spec.vocab, "n_positions": spec.context_length,
        "layer_norm_epsilon": spec.norm_eps, "activation_function": ACTIVATION_TO_HF[spec.activation],
        "scale_attn_weights": spec.attention_scale == 0.0, "tie_word_embeddings": spec.tied_embeddings,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    }


_LAYER = "transformer.h.{i}."
WEIGHTS = WeightMap(
    embedding=(
        WeightRule("word_embeddings.weight", ("transformer.wte.weight",), "vocab"),
        WeightRule("position_embeddings.weight", ("transformer.wpe.weight",)),
    ),
    block=(
        *(WeightRule(f"input_layernorm.{p}", (_LAYER + f"ln_1.{p}",)) for p in ("weight", "bias")),
        WeightRule("self_attention.linear_qkv.weight", (_LAYER + "attn.c_attn.weight",), "qkv_cat_t"),
        WeightRule("self_attention.linear_qkv.bias", (_LAYER + "attn.c_attn.bias",), "qkv_cat"),
        WeightRule("self_attention.linear_proj.weight", (_LAYER + "attn.c_proj.weight",), "t"),
        WeightRule("self_attention.linear_proj.bias", (_LAYER + "attn.c_proj.bias",)),
        *(WeightRule(f"pre_mlp_layernorm.{p}", (_LAYER + f"ln_2.{p}",)) for p in ("weight", "bias")),
        WeightRule("mlp.linear_fc1.weight", (_LAYER + "mlp.c_fc.weight",), "t"),
        WeightRule("mlp.linear_fc1.bias", (_LAYER + "mlp.c_fc.bias",)),
        WeightRule("mlp.linear_fc2.weight", (_LAYER + "mlp.c_proj.weight",), "t"),
        WeightRule("mlp.linear_fc2.bias", (_LAYER + "mlp.c_proj.bias",)),
    ),
    final_norm=(),
    head=(
        *(WeightRule(f"final_layernorm.{p}", (f"transformer.ln_f.{p}",)) for p in ("weight", "bias")),
        WeightRule("output_layer.weight", ("lm_head.weight",), "vocab"),
    ),
)

FAMILY = Family("gpt2", ("gpt2",), from_hf, to_hf, WEIGHTS)


def bigcode_from_hf(cfg, model_type: str) -> dict:
    if cfg.bool("add_cross_attention", False):
        raise SailorError(f"model config {cfg.source}: add_cross_attention (an encoder-decoder's cross-attention) is "
                          "not supported for gpt_bigcode; set it to false")
    fields = from_hf(cfg, model_type)
    return {**fields, "kv_heads": 1 if cfg.bool("multi_query", True) and fields["heads"] > 1 else 0,
            "activation": cfg.activation("activation_function", "gelu_pytorch_tanh"), "pad_token": cfg.pad_token(None)}


def bigcode_to_hf(spec: ModelSpec) -> dict:
    if spec.num_query_groups not in (1, spec.heads):
        raise SailorError(f"{spec.name} cannot be written as a gpt_bigcode config: its {spec.num_query_groups} key/"
                          "value heads are neither one nor one per head")
    cfg = to_hf(replace(spec, kv_heads=0))
    return {**cfg, "model_type": "gpt_bigcode", "multi_query": spec.num_query_groups == 1,
            "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None}


# GPT-2's names, each weight as a Linear keeps it ([out, in]), c_attn as it is (megatron's layout)
BIGCODE_WEIGHTS = replace(WEIGHTS, block=tuple(replace(r, op="copy") if r.op in ("t", "qkv_cat_t", "qkv_cat") else r
                                               for r in WEIGHTS.block))

BIGCODE = Family("gpt_bigcode", ("gpt_bigcode",), bigcode_from_hf, bigcode_to_hf, BIGCODE_WEIGHTS)
