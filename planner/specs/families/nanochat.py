"""nanochat (model_type nanochat: Karpathy's nanochat, as transformers converts it): LLaMA's attention with a plain
MLP fc1 -> ReLU squared (relu2) -> fc2, and RMSNorms without weights (ModelSpec.norm_weight) everywhere: before each
sublayer, on the embeddings before the first block (embedding_norm), before the head, and on each head's q and k
(qk_l2_norm; after the rotary positions there, which a norm without weight commutes with). Its rotary positions
turn the other way (rotary_reversed), and its logits are capped at 15 * tanh(x / 15) (final_logit_softcapping).
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule, llama

PAD_TOKEN = 1  # nanochat's pad_token_id when its config gives none (its row is never trained)
SOFTCAP = 15.0  # its final_logit_softcapping when its config gives none


def from_hf(cfg, model_type: str) -> dict:
    cap = cfg.cfg.get("final_logit_softcapping", SOFTCAP)
    return {**llama.from_hf(cfg, "llama"), "gated_mlp": False, "activation": cfg.activation("hidden_act", "relu2"),
            "norm_weight": False, "separate_final_norm": False, "mlp_bias": False, "qk_l2_norm": True,
            "embedding_norm": True, "rotary_reversed": True, "pad_token": cfg.pad_token(PAD_TOKEN),
            "logit_softcap": 0.0 if cap is None else cfg.number("final_logit_softcapping", cap)}


def to_hf(spec) -> dict:
    if not (spec.rms_norm and spec.qk_l2_norm and spec.embedding_norm and spec.rotary_reversed) or spec.norm_weight \
            or spec.gated_mlp or spec.mlp_bias or spec.qkv_bias != spec.out_bias or spec.windows or spec.qk_norm or \
            spec.parallel_residual or spec.rotary_fraction != 1 or spec.rotary_interleaved or spec.nope_blocks or \
            spec.experts or spec.sandwich_norm or spec.attention_scale or spec.head_bias or spec.attn_softcap:
        raise SailorError(f"{spec.name} cannot be written as a nanochat config: its layers differ from nanochat's")
    return {
        "model_type": "nanochat", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups, "head_dim": spec.head_dim,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "max_position_embeddings": spec.context_length,
        "rms_norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation],
        "rope_parameters": llama.hf_rope(spec), "attention_bias": spec.qkv_bias,
        "final_logit_softcapping": spec.logit_softcap or None, "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None, "attention_dropout": 0.0,
    }


_LAYER = "model.layers.{i}."
# LLaMA's attention tensors, fc1 and fc2 for the MLP; the norms have none
WEIGHTS = WeightMap(
    embedding=llama.WEIGHTS.embedding,
    block=(*(r for r in llama.WEIGHTS.block if r.ours.startswith("self_attention.linear_")),
           *(WeightRule(f"mlp.linear_{fc}.weight", (f"{_LAYER}mlp.{fc}.weight",)) for fc in ("fc1", "fc2"))),
    final_norm=(),
    head=llama.WEIGHTS.head,
)

FAMILY = Family("nanochat", ("nanochat",), from_hf, to_hf, WEIGHTS)
