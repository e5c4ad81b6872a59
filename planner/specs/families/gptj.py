"""GPT-J (model_type gptj: GPT-J-6B and its fine-tunes): Phi's block shape before Phi.

Attention and a GELU MLP side by side on one shared LayerNorm, x + attn(ln(x)) + mlp(ln(x)); rotary
positions on the first rotary_dim dimensions of each head, turning adjacent pairs (base 10,000); no biases
in attention, biases in the MLP and on the output layer; the final LayerNorm in the head.
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.model import MAX_BLOCKS, ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    hidden, heads = cfg.int("n_embd", 4096), cfg.int("n_head", 16)
    if "rotary_dim" in cfg.cfg and cfg.cfg["rotary_dim"] is None:  # (transformers' GPT-J then rotates with
        # hidden_size's angles, not a head's)
        raise SailorError(f"model config {cfg.source}: gptj needs rotary_dim, the dimensions of each head that "
                          "rotary positions turn; set it (GPT-J-6B's is 64)")
    rotary = cfg.int("rotary_dim", 64)
    if hidden % heads or rotary > hidden // heads or rotary % 2:
        raise SailorError(f"model config {cfg.source}: rotary_dim {rotary} must be even and at most a head's "
                          f"{hidden // heads if not hidden % heads else '?'} dimensions")
    return dict(
        hidden=hidden, num_blocks=cfg.int("n_layer", 28, hi=MAX_BLOCKS), heads=heads,
        ffn_hidden=cfg.int("n_inner", 4 * hidden), vocab=cfg.int("vocab_size", 50400),
        max_positions=cfg.int("n_positions", 2048), tied_embeddings=cfg.bool("tie_word_embeddings", False),
        learned_positions=False, qkv_bias=False, out_bias=False, mlp_bias=True, head_bias=True,
        parallel_residual=True, shared_norm=True, activation=cfg.activation("activation_function", "gelu_new"),
        norm_eps=cfg.float("layer_norm_epsilon", 1e-5), rope_theta=10000.0, rotary_fraction=rotary / (hidden // heads),
        rotary_interleaved=True, pad_token=cfg.pad_token(None),
    )


def to_hf(spec: ModelSpec) -> dict:
    if spec.rms_norm or not spec.norm_bias or spec.gated_mlp or spec.learned_positions or spec.windows or \
            spec.projected or spec.post_norm or spec.qkv_bias or spec.out_bias or not (
                spec.mlp_bias and spec.head_bias and spec.parallel_residual and spec.shared_norm and
                spec.rotary_interleaved) or spec.separate_final_norm or spec.attention_scale or spec.qk_norm or \
            spec.kv_heads not in (0, spec.heads) or spec.head_dim_override or spec.rope_theta != 10000.0 or \
            spec.rope_scaling or spec.experts or spec.nope_blocks:
        raise SailorError(f"{spec.name} cannot be written as a gptj config: its layers differ from GPT-J's")
    return {
        "model_type": "gptj", "n_embd": spec.hidden, "n_layer": spec.num_blocks, "n_head": spec.heads,
        "n_inner": spec.ffn_hidden, "vocab_size": spec.vocab, "n_positions": spec.context_length,
        "rotary_dim": spec.rotary_dim, "layer_norm_epsilon": spec.norm_eps,
        "activation_function": ACTIVATION_TO_HF[spec.activation], "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    }


_LAYER = "transformer.h.{i}."
WEIGHTS = WeightMap(
    embedding=(WeightRule("word_embeddings.weight", ("transformer.wte.weight",), "vocab"),),
    block=(
        *(WeightRule(f"input_layernorm.{p}", (_LAYER + f"ln_1.{p}",)) for p in ("weight", "bias")),
        WeightRule("self_attention.linear_qkv.weight", tuple(_LAYER + f"attn.{x}_proj.weight" for x in "qkv"), "qkv"),
        WeightRule("self_attention.linear_proj.weight", (_LAYER + "attn.out_proj.weight",)),
        *(WeightRule(f"mlp.linear_fc1.{p}", (_LAYER + f"mlp.fc_in.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc2.{p}", (_LAYER + f"mlp.fc_out.{p}",)) for p in ("weight", "bias")),
    ),
    final_norm=(),
    head=(*(WeightRule(f"final_layernorm.{p}", (f"transformer.ln_f.{p}",)) for p in ("weight", "bias")),
          *(WeightRule(f"output_layer.{p}", (f"lm_head.{p}",), "vocab") for p in ("weight", "bias"))),
)

FAMILY = Family("gptj", ("gptj",), from_hf, to_hf, WEIGHTS)
