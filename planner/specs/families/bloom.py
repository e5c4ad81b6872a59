"""BLOOM (model_type bloom: BLOOM 560M to 176B, BLOOMZ): ALiBi instead of positions, a LayerNorm on the word
embeddings, LayerNorms and linears with biases, a 4 x wide tanh-GELU MLP, the head tied to the embedding.

Each head's attention scores get its ALiBi slope times the key's position (ModelSpec.alibi; the slopes are
sailor_ext.attention.alibi_slopes). The fused query_key_value holds [q_h; k_h; v_h] head after head: megatron's own
layout with one query group per head, copied as it is. ALiBi sets no context length: the config's seq_length, or
BLOOM's training length, 2048, bounds --seq-length. Refused: apply_residual_connection_post_layernorm (the residual
taken after the norm).
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import Family, WeightMap, WeightRule
from planner.specs.model import MAX_BLOCKS, ModelSpec


TRAINED_LENGTH = 2048  # the sequence length BLOOM was trained at


def from_hf(cfg, model_type: str) -> dict:
    if cfg.bool("apply_residual_connection_post_layernorm", False):
        raise SailorError(f"model config {cfg.source}: apply_residual_connection_post_layernorm (the residual taken "
                          "after the norm) is not supported for bloom; set it to false")
    hidden = cfg.int("hidden_size", 64)
    return dict(
        hidden=hidden, num_blocks=cfg.int("n_layer", 2, hi=MAX_BLOCKS), heads=cfg.int("n_head", 8),
        ffn_hidden=4 * hidden, vocab=cfg.int("vocab_size", 250880), max_positions=cfg.int("seq_length", TRAINED_LENGTH),
        tied_embeddings=cfg.bool("tie_word_embeddings", True), learned_positions=False, alibi=True,
        embedding_norm=True, activation="gelu_tanh", norm_eps=cfg.float("layer_norm_epsilon", 1e-5),
        pad_token=cfg.pad_token(None),
    )


def to_hf(spec: ModelSpec) -> dict:
    if not (spec.alibi and spec.embedding_norm and spec.qkv_bias and spec.out_bias and spec.mlp_bias and
            spec.norm_bias) or spec.rms_norm or spec.gated_mlp or spec.ffn_hidden != 4 * spec.hidden or \
            spec.kv_heads not in (0, spec.heads) or spec.head_dim_override or spec.windows or spec.parallel_residual \
            or spec.post_norm or spec.projected or spec.separate_final_norm or spec.attention_scale or \
            spec.activation != "gelu_tanh" or spec.qk_norm or spec.experts or spec.head_bias:
        raise SailorError(f"{spec.name} cannot be written as a bloom config: its layers differ from BLOOM's")
    return {
        "model_type": "bloom", "hidden_size": spec.hidden, "n_layer": spec.num_blocks, "n_head": spec.heads,
        "vocab_size": spec.vocab, "seq_length": spec.context_length, "layer_norm_epsilon": spec.norm_eps,
        "tie_word_embeddings": spec.tied_embeddings, "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    }


_LAYER = "transformer.h.{i}."
_BOTH = ("weight", "bias")
WEIGHTS = WeightMap(
    embedding=(WeightRule("word_embeddings.weight", ("transformer.word_embeddings.weight",), "vocab"),
               *(WeightRule(f"embedding_layernorm.{p}", (f"transformer.word_embeddings_layernorm.{p}",))
                 for p in _BOTH)),
    block=tuple(WeightRule(f"{ours}.{p}", (f"{_LAYER}{theirs}.{p}",)) for p in _BOTH for ours, theirs in (
        ("input_layernorm", "input_layernorm"), ("pre_mlp_layernorm", "post_attention_layernorm"),
        ("self_attention.linear_qkv", "self_attention.query_key_value"),
        ("self_attention.linear_proj", "self_attention.dense"),
        ("mlp.linear_fc1", "mlp.dense_h_to_4h"), ("mlp.linear_fc2", "mlp.dense_4h_to_h"))),
    final_norm=(),
    head=(*(WeightRule(f"final_layernorm.{p}", (f"transformer.ln_f.{p}",)) for p in _BOTH),
          WeightRule("output_layer.weight", ("lm_head.weight",), "vocab")),
)

FAMILY = Family("bloom", ("bloom",), from_hf, to_hf, WEIGHTS)
