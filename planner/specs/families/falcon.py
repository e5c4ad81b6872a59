"""Falcon (model_type falcon: Falcon-7B, 40B, 180B and 11B): rotary positions, LayerNorms with biases, a GELU MLP
4 x hidden wide, biases on every linear or none (bias), the head tied to the embedding unless set otherwise.

Three block shapes, by config field:
  * Falcon-7B (multi_query, parallel_attn): one key/value head, attention and MLP side by side on one norm,
    x + attn(ln(x)) + mlp(ln(x));
  * Falcon-40B and 180B (new_decoder_architecture, two norms): num_kv_heads query groups, each sublayer on its own
    norm, x + attn(ln_attn(x)) + mlp(ln_mlp(x)); with num_ln_in_parallel_attn 1 (Falcon-11B) one norm for both;
  * parallel_attn false: the sublayers one after the other; without multi_query every head has its own keys.
The fused query_key_value tensor holds, group after group, [the group's q heads; k; v]: megatron's own layout, so
it is copied as it is. Falcon-40B's norms have names of their own (ln_attn, ln_mlp), so such a model is of a
family of its own here (FALCON_40B) that shares this reader. ALiBi (Falcon-RW) is refused.
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule, llama
from planner.specs.model import MAX_BLOCKS, ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    if cfg.bool("alibi", False):
        raise SailorError(f"model config {cfg.source}: falcon with alibi (ALiBi attention biases instead of rotary "
                          "positions, as Falcon-RW) is not supported; use a rotary Falcon (alibi false)")
    hidden, heads = cfg.int("hidden_size", 4544), cfg.int("num_attention_heads", 71)
    new = cfg.bool("new_decoder_architecture", False)
    parallel = new or cfg.bool("parallel_attn", True)  # (the new architecture is always parallel)
    if new:
        kv_heads = cfg.int("num_kv_heads", heads)
        lns = cfg.int("num_ln_in_parallel_attn", 2)
        if lns > 2:
            raise SailorError(f"model config {cfg.source}: num_ln_in_parallel_attn must be 1 or 2, not {lns}")
        shared = lns == 1
    else:
        if parallel and cfg.int("num_ln_in_parallel_attn", 1) != 1:  # (transformers builds two norms, reads one)
            raise SailorError(f"model config {cfg.source}: num_ln_in_parallel_attn 2 needs new_decoder_architecture; "
                              "set it to 1 or leave it out")
        kv_heads = 1 if cfg.bool("multi_query", True) else heads
        if not cfg.bool("multi_query", True) and cfg.int("num_kv_heads", heads) != heads:  # (transformers' old
            # architecture gives every head its keys then, and fails on another count)
            raise SailorError(f"model config {cfg.source}: num_kv_heads {cfg.int('num_kv_heads')} needs "
                              "new_decoder_architecture; set it to num_attention_heads or leave it out")
        shared = parallel
    bias = cfg.bool("bias", False)
    theta, scaling = llama._rope(cfg)
    return dict(
        family=FALCON_40B.name if parallel and not shared else FAMILY.name,
        hidden=hidden, num_blocks=cfg.int("num_hidden_layers", 32, hi=MAX_BLOCKS), heads=heads,
        kv_heads=0 if kv_heads == heads else kv_heads, ffn_hidden=cfg.int("ffn_hidden_size", 4 * hidden),
        vocab=cfg.int("vocab_size", 65024), max_positions=cfg.int("max_position_embeddings", 2048),
        tied_embeddings=cfg.bool("tie_word_embeddings", True), learned_positions=False, qkv_bias=bias, out_bias=bias,
        mlp_bias=bias, parallel_residual=parallel, shared_norm=shared, activation=cfg.activation("activation", "gelu"),
        norm_eps=cfg.float("layer_norm_epsilon", 1e-5), rope_theta=theta, rope_scaling=scaling,
        pad_token=cfg.pad_token(None),
    )


def to_hf(spec: ModelSpec) -> dict:
    groups = spec.num_query_groups
    new = spec.family == FALCON_40B.name or groups not in (1, spec.heads)
    if spec.rms_norm or not spec.norm_bias or spec.gated_mlp or spec.learned_positions or spec.windows or \
            spec.projected or spec.post_norm or len({spec.qkv_bias, spec.out_bias, spec.mlp_bias}) > 1 or \
            spec.head_bias or spec.head_dim_override or spec.separate_final_norm or spec.attention_scale or \
            spec.qk_norm or spec.rotary_fraction != 1 or spec.rotary_interleaved or spec.experts or \
            spec.nope_blocks or (new and not spec.parallel_residual) or \
            (spec.family == FALCON_40B.name) != (spec.parallel_residual and not spec.shared_norm):
        raise SailorError(f"{spec.name} cannot be written as a falcon config: its layers differ from Falcon's")
    return {
        "model_type": "falcon", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_kv_heads": groups, "new_decoder_architecture": new,
        "multi_query": groups == 1, "parallel_attn": spec.parallel_residual,
        "num_ln_in_parallel_attn": (1 if spec.shared_norm else 2) if new else None, "alibi": False,
        "bias": spec.qkv_bias, "ffn_hidden_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "layer_norm_epsilon": spec.norm_eps,
        "activation": ACTIVATION_TO_HF[spec.activation], "rope_parameters": llama.hf_rope(spec),
        "tie_word_embeddings": spec.tied_embeddings, "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
    }


_LAYER = "transformer.h.{i}."


def _weights(attn_norm: str, mlp_norm: str) -> WeightMap:
    return WeightMap(
        embedding=(WeightRule("word_embeddings.weight", ("transformer.word_embeddings.weight",), "vocab"),),
        block=tuple(WeightRule(f"{ours}.{p}", (f"{_LAYER}{theirs}.{p}",)) for p in ("weight", "bias") for ours, theirs
                    in (("input_layernorm", attn_norm), ("pre_mlp_layernorm", mlp_norm),
                        ("self_attention.linear_qkv", "self_attention.query_key_value"),
                        ("self_attention.linear_proj", "self_attention.dense"),
                        ("mlp.linear_fc1", "mlp.dense_h_to_4h"), ("mlp.linear_fc2", "mlp.dense_4h_to_h"))),
        final_norm=(),
        head=(*(WeightRule(f"final_layernorm.{p}", (f"transformer.ln_f.{p}",)) for p in ("weight", "bias")),
              WeightRule("output_layer.weight", ("lm_head.weight",), "vocab")),
    )


FAMILY = Family("falcon", ("falcon",), from_hf, to_hf, _weights("input_layernorm", "post_attention_layernorm"))
# Falcon-40B's blocks: a norm for each sublayer, side by side (read by FAMILY's reader, never chosen by model_type)
FALCON_40B = Family("falcon-40b", (), from_hf, to_hf, _weights("ln_attn", "ln_mlp"))
