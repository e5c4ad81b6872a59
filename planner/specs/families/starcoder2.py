"""StarCoder2 (model_type starcoder2): grouped-query attention with rotary positions, LayerNorms
with biases, a plain tanh-GELU MLP (c_fc, c_proj), biases on every linear (use_bias), a sliding
window on every block when the config sets one, the head tied to the embedding by default.
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.families import llama
from planner.specs.model import MAX_BLOCKS, ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    kv_heads = cfg.int("num_key_value_heads", heads)
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)
    bias = cfg.bool("use_bias", True)
    theta, scaling = llama._rope(cfg)
    return dict(
        hidden=hidden, num_blocks=blocks, heads=heads, ffn_hidden=cfg.int("intermediate_size"),
        vocab=cfg.int("vocab_size"), max_positions=cfg.int("max_position_embeddings"),
        kv_heads=0 if kv_heads == heads else kv_heads, tied_embeddings=cfg.bool("tie_word_embeddings", True),
        learned_positions=False, qkv_bias=bias, out_bias=bias, mlp_bias=bias, separate_final_norm=True,
        activation=cfg.activation("hidden_act", "gelu_pytorch_tanh"), norm_eps=cfg.float("norm_epsilon", 1e-5),
        windows=llama._windows(cfg, model_type, blocks), rope_theta=theta, rope_scaling=scaling,
        pad_token=cfg.pad_token(None),
    )


def to_hf(spec: ModelSpec) -> dict:
    windows = {w for w in spec.windows if w}
    if spec.rms_norm or spec.gated_mlp or spec.learned_positions or spec.projected or spec.post_norm or \
            not spec.separate_final_norm or not spec.final_norm or spec.head_dim_override or spec.attention_scale \
            or spec.qk_norm or spec.parallel_residual or spec.rotary_fraction != 1.0 or \
            len({spec.qkv_bias, spec.out_bias, spec.mlp_bias}) > 1 or len(windows) > 1 or \
            (windows and 0 in spec.windows):
        raise SailorError(f"{spec.name} cannot be written as a StarCoder2 config: its layers differ from "
                          "StarCoder2's")
    return {
        "model_type": "starcoder2", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "norm_epsilon": spec.norm_eps,
        "hidden_act": ACTIVATION_TO_HF[spec.activation], "use_bias": spec.qkv_bias,
        "rope_parameters": llama.hf_rope(spec), "tie_word_embeddings": spec.tied_embeddings,
        "sliding_window": windows.pop() if windows else None,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0,
    }


_LAYER = "model.layers.{i}."
_BOTH = ("weight", "bias")
WEIGHTS = WeightMap(
    embedding=(WeightRule("word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),),
    block=(
        *(WeightRule(f"input_layernorm.{p}", (_LAYER + f"input_layernorm.{p}",)) for p in _BOTH),
        *(WeightRule(f"self_attention.linear_qkv.{p}", tuple(_LAYER + f"self_attn.{x}_proj.{p}" for x in "qkv"), "qkv")
          for p in _BOTH),
        *(WeightRule(f"self_attention.linear_proj.{p}", (_LAYER + f"self_attn.o_proj.{p}",)) for p in _BOTH),
        *(WeightRule(f"pre_mlp_layernorm.{p}", (_LAYER + f"post_attention_layernorm.{p}",)) for p in _BOTH),
        *(WeightRule(f"mlp.linear_fc1.{p}", (_LAYER + f"mlp.c_fc.{p}",)) for p in _BOTH),
        *(WeightRule(f"mlp.linear_fc2.{p}", (_LAYER + f"mlp.c_proj.{p}",)) for p in _BOTH),
    ),
    final_norm=tuple(WeightRule(f"final_layernorm.{p}", (f"model.norm.{p}",)) for p in _BOTH),
    head=(WeightRule("output_layer.weight", ("lm_head.weight",), "vocab"),),
)

FAMILY = Family("starcoder2", ("starcoder2",), from_hf, to_hf, WEIGHTS)
