"""StableLM (model_type stablelm: StableLM-3B-4E1T, StableLM 2 1.6B and 12B, StableCode 3B): LLaMA's gated MLP
and grouped-query attention with LayerNorms that have biases.

Rotary positions turn a share of each head (partial_rotary_factor, 0.25 by default; halves, as LLaMA's), q, k
and v have biases with use_qkv_bias, the output projection and the MLP none. With use_parallel_residual
(StableLM 2 12B) attention and MLP run side by side on one norm: x + attn(ln(x)) + mlp(ln(x)). With qk_layernorm
(StableLM 2 12B) each head's q and k pass a LayerNorm of their own without bias before the rotary positions
(ModelSpec.qk_norm_per_head), saved as one tensor per head.
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule, llama, phi3
from planner.specs.model import MAX_BLOCKS, ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    heads = cfg.int("num_attention_heads")
    kv_heads = cfg.int("num_key_value_heads", heads)
    theta, scaling = llama._rope(cfg)
    parallel = cfg.bool("use_parallel_residual", False)
    return dict(
        hidden=cfg.int("hidden_size"), num_blocks=cfg.int("num_hidden_layers", hi=MAX_BLOCKS), heads=heads,
        kv_heads=0 if kv_heads == heads else kv_heads, ffn_hidden=cfg.int("intermediate_size"),
        vocab=cfg.int("vocab_size"), max_positions=cfg.int("max_position_embeddings"),
        tied_embeddings=cfg.bool("tie_word_embeddings", False), gated_mlp=True, rms_norm=False,
        learned_positions=False, qkv_bias=cfg.bool("use_qkv_bias", False), out_bias=False, mlp_bias=False,
        separate_final_norm=True, activation=cfg.activation("hidden_act", "silu"),
        norm_eps=cfg.float("layer_norm_eps", 1e-5), rope_theta=theta, rope_scaling=scaling,
        rotary_fraction=phi3.rotary_fraction(cfg, 0.25), parallel_residual=parallel, shared_norm=parallel,
        pad_token=cfg.pad_token(None), **({"qk_norm": True, "qk_norm_per_head": True} if cfg.bool("qk_layernorm", False)
                                          else {}),
    )


def to_hf(spec: ModelSpec) -> dict:
    if spec.rms_norm or not spec.norm_bias or not spec.gated_mlp or spec.out_bias or spec.mlp_bias or \
            spec.head_dim_override or spec.windows or spec.qk_norm != spec.qk_norm_per_head or \
            spec.parallel_residual != spec.shared_norm or \
            spec.learned_positions or spec.projected or spec.post_norm or spec.rotary_interleaved:
        raise SailorError(f"{spec.name} cannot be written as a stablelm config: its layers differ from StableLM's")
    return {
        "model_type": "stablelm", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "max_position_embeddings": spec.context_length,
        "layer_norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation],
        "rope_parameters": {**llama.hf_rope(spec), "partial_rotary_factor": spec.rotary_fraction},
        "use_qkv_bias": spec.qkv_bias, "qk_layernorm": spec.qk_norm_per_head,
        "use_parallel_residual": spec.parallel_residual,
        "tie_word_embeddings": spec.tied_embeddings, "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
    }


_LAYER = "model.layers.{i}."
_NORMS = {"input_layernorm.weight": "input_layernorm", "pre_mlp_layernorm.weight": "post_attention_layernorm"}
# LLaMA's names, with the LayerNorms' biases and one q (k) norm weight per query (key/value) head
WEIGHTS = WeightMap(
    embedding=llama.WEIGHTS.embedding,
    block=(*(r for r in llama.WEIGHTS.block if "q_layernorm" not in r.ours and "k_layernorm" not in r.ours),
           *(WeightRule(ours.replace("weight", "bias"), (f"{_LAYER}{theirs}.bias",))
             for ours, theirs in _NORMS.items()),
           *(WeightRule(f"self_attention.{x}_layernorm.weight",
                        (f"{_LAYER}self_attn.{x}_layernorm.norms.{{{h}}}.weight",), "heads")
             for x, h in (("q", "h"), ("k", "g")))),
    final_norm=(*llama.WEIGHTS.final_norm, WeightRule("final_layernorm.bias", ("model.norm.bias",))),
    head=llama.WEIGHTS.head,
)

FAMILY = Family("stablelm", ("stablelm",), from_hf, to_hf, WEIGHTS)
