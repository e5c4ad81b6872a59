"""OPT: learned positions offset by 2, ReLU MLP, tied head; OPT-350m projects a
512-wide word embedding to the 1024-wide blocks and normalises after each
residual add (post-LN, `do_layer_norm_before: false`)."""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.model import MAX_BLOCKS, ModelSpec

POSITION_OFFSET = 2  # OPT's position table keeps two rows before position 0


def from_hf(cfg, model_type: str) -> dict:
    hidden = cfg.int("hidden_size")
    pre_norm = cfg.bool("do_layer_norm_before", True)
    bias = cfg.bool("enable_bias", True)
    affine = cfg.bool("layer_norm_elementwise_affine", True)  # (false: LayerNorms without weights or biases)
    return dict(
        hidden=hidden, num_blocks=cfg.int("num_hidden_layers", hi=MAX_BLOCKS), heads=cfg.int("num_attention_heads"),
        ffn_hidden=cfg.int("ffn_dim"), vocab=cfg.int("vocab_size"), max_positions=cfg.int("max_position_embeddings"),
        tied_embeddings=cfg.bool("tie_word_embeddings", True), qkv_bias=bias, out_bias=bias, mlp_bias=bias,
        position_offset=POSITION_OFFSET, embed_dim=cfg.int("word_embed_proj_dim", hidden),
        post_norm=not pre_norm, final_norm=pre_norm and not cfg.bool("_remove_final_layer_norm", False),
        activation=cfg.activation("activation_function", "relu"), pad_token=cfg.pad_token(1), norm_weight=affine,
        norm_bias=affine,
    )


def to_hf(spec: ModelSpec) -> dict:
    if spec.rms_norm or spec.gated_mlp or not spec.learned_positions or spec.windows \
            or len({spec.qkv_bias, spec.out_bias, spec.mlp_bias}) > 1 or spec.final_norm == spec.post_norm \
            or spec.separate_final_norm or spec.kv_heads not in (0, spec.heads) or spec.head_dim_override \
            or spec.norm_bias != spec.norm_weight:
        raise SailorError(f"{spec.name} cannot be written as an OPT config: its layers differ from OPT's")
    return {
        "model_type": "opt", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "ffn_dim": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "word_embed_proj_dim": spec.word_dim,
        "do_layer_norm_before": not spec.post_norm, "enable_bias": spec.qkv_bias,
        "activation_function": ACTIVATION_TO_HF[spec.activation], "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None, "_remove_final_layer_norm": False,
        "layer_norm_elementwise_affine": spec.norm_weight,
        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "layerdrop": 0.0,
    }


_LAYER = "model.decoder.layers.{i}."
WEIGHTS = WeightMap(
    embedding=(
        WeightRule("word_embeddings.weight", ("model.decoder.embed_tokens.weight",), "vocab"),
        WeightRule("project_in.weight", ("model.decoder.project_in.weight",)),
        WeightRule("position_embeddings.weight", ("model.decoder.embed_positions.weight",)),
    ),
    block=(
        *(WeightRule(f"input_layernorm.{p}", (_LAYER + f"self_attn_layer_norm.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"self_attention.linear_qkv.{p}", tuple(_LAYER + f"self_attn.{x}_proj.{p}" for x in "qkv"),
                     "qkv") for p in ("weight", "bias")),
        *(WeightRule(f"self_attention.linear_proj.{p}", (_LAYER + f"self_attn.out_proj.{p}",))
          for p in ("weight", "bias")),
        *(WeightRule(f"pre_mlp_layernorm.{p}", (_LAYER + f"final_layer_norm.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc1.{p}", (_LAYER + f"fc1.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc2.{p}", (_LAYER + f"fc2.{p}",)) for p in ("weight", "bias")),
    ),
    final_norm=(),
    head=(
        *(WeightRule(f"final_layernorm.{p}", (f"model.decoder.final_layer_norm.{p}",)) for p in ("weight", "bias")),
        WeightRule("project_out.weight", ("model.decoder.project_out.weight",)),
        WeightRule("output_layer.weight", ("lm_head.weight",), "vocab"),
    ),
)

FAMILY = Family("opt", ("opt",), from_hf, to_hf, WEIGHTS)
