"""Qwen3.5 (model_type qwen3_5_text, and the language model of the multimodal qwen3_5: Qwen3.5-27B), Qwen3.5-MoE
(qwen3_5_moe_text, qwen3_5_moe: Qwen3.5-35B-A3B, -122B-A10B, -397B-A17B) and Qwen3-Next (qwen3_next:
Qwen3-Next-80B-A3B), their forerunner.

Three blocks in four (layer_types; by default every full_attention_interval-th block is full attention)
run Gated DeltaNet, a linear attention (ModelSpec.linear_blocks; sailor_ext/linear_attention.py). The
others run grouped-query attention with per-head q/k norms and an output gate: q_proj holds each head's q
and gate, and the attention's output is multiplied by sigmoid(gate) before o_proj (ModelSpec.attention_gate).
Rotary positions turn the first quarter of each head (partial_rotary_factor) by halves; the multimodal
rotary sections (mrope_section) turn text positions as one-dimensional rotary positions do. Every RMSNorm
but DeltaNet's output norm scales by (1 + w) (norm_offset).

Qwen3.5-MoE's blocks are the same with a mixture of experts for the MLP: a softmax router sending each token to
num_experts_per_tok experts, their weights renormalised, and a shared expert gated by a sigmoid (Qwen2-MoE's);
its checkpoints name each expert's tensors (`experts.{e}.gate_proj`), as Qwen2-MoE's do.

Qwen3-Next has Qwen3.5-MoE's layers with Gated DeltaNet's projections in two tensors grouped by key head,
`in_proj_qkvz` ([q, k, v, z] of each key head's group) and `in_proj_ba` ([b, a] of each; sailor_ext.hf takes them
apart); its router's weights are renormalised if norm_topk_prob (the default), and blocks in mlp_only_layers, or
off decoder_sparse_step, have a dense MLP intermediate_size wide (ModelSpec.dense_blocks).

The multimodal configs (model_type qwen3_5, qwen3_5_moe) nest the language model's fields in text_config and its
weights under model.language_model; sailor trains and exports the language model alone, as a qwen3_5_text
(qwen3_5_moe_text) checkpoint (families.MULTIMODAL).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ACTIVATION_TO_HF, ConfigReader, Family, WeightRule, llama, moe, phi3
from planner.specs.model import MAX_BLOCKS, ModelSpec

# transformers' Qwen3_5TextConfig defaults (5.24), for fields a config leaves out
TEXT_DEFAULTS = {"vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
                 "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                 "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4,
                 "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                 "linear_num_value_heads": 32}
# transformers' Qwen3_5MoeTextConfig defaults (5.24: Qwen3.5-35B-A3B's shape)
MOE_DEFAULTS = {"vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
                "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_num_key_heads": 16, "linear_num_value_heads": 32, "moe_intermediate_size": 512,
                "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256}
# transformers' Qwen3NextConfig defaults (5.24: Qwen3-Next-80B-A3B's shape)
NEXT_DEFAULTS = {**MOE_DEFAULTS, "vocab_size": 151936, "intermediate_size": 5632, "num_hidden_layers": 48,
                 "num_experts_per_tok": 10, "num_experts": 512}
FULL_ATTENTION_INTERVAL = 4
LAYER_TYPES = ("linear_attention", "full_attention")


def text_config(cfg, model_type: str):
    """The config with transformers' defaults."""
    defaults = NEXT_DEFAULTS if model_type == "qwen3_next" else MOE_DEFAULTS if model_type == "qwen3_5_moe_text" \
        else TEXT_DEFAULTS
    return ConfigReader({**defaults, **cfg.cfg}, cfg.source)


def _linear_blocks(cfg, blocks: int) -> tuple[int, ...]:
    layer_types = cfg.cfg.get("layer_types")
    if layer_types is None:
        interval = cfg.int("full_attention_interval", FULL_ATTENTION_INTERVAL)
        return tuple(i for i in range(blocks) if (i + 1) % interval)
    if not isinstance(layer_types, list) or len(layer_types) != blocks or any(t not in LAYER_TYPES
                                                                              for t in layer_types):
        raise SailorError(f"model config {cfg.source}: layer_types must list linear_attention or full_attention "
                          f"for each of the {blocks} layers, not {short(layer_types)}")
    return tuple(i for i, t in enumerate(layer_types) if t == "linear_attention")


def _dense_blocks(cfg, blocks: int) -> dict:
    """Qwen3-Next's blocks with a dense MLP among the experts': those in mlp_only_layers, and those off
    decoder_sparse_step (block i has experts when (i + 1) % step == 0)."""
    only, step = cfg.cfg.get("mlp_only_layers") or [], cfg.int("decoder_sparse_step", 1)
    if not isinstance(only, list) or any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < blocks
                                         for b in only):
        raise SailorError(f"model config {cfg.source}: mlp_only_layers must list block indices from 0 to "
                          f"{blocks - 1}, not {short(only)}")
    dense = tuple(i for i in range(blocks) if i in only or (i + 1) % step)
    return {"dense_blocks": dense, "dense_ffn": cfg.int("intermediate_size")} if dense else {}


def from_hf(cfg, model_type: str) -> dict:
    text = text_config(cfg, model_type)
    blocks = text.int("num_hidden_layers", hi=MAX_BLOCKS)
    if text.cfg.get("use_sliding_window") or text.cfg.get("sliding_window"):
        raise SailorError(f"model config {text.source}: {model_type}'s attention has no sliding window; remove "
                          "sliding_window")
    experts = model_type == "qwen3_5_moe_text" or model_type == "qwen3_next" and text.cfg.get("num_experts") != 0
    if experts:
        moe.refuse_router_logits(text)
    # LLaMA's fields (heads, widths, rotary base), read without the layer types, which name linear blocks here (an
    # expert's width for the MLP's with experts)
    reader = ConfigReader({**text.cfg, "layer_types": None, **(
        {"intermediate_size": text.int("moe_intermediate_size")} if experts else {})}, text.source)
    fields = llama.from_hf(reader, "qwen3_5_text")
    if experts:  # the router's weights renormalised (Qwen3-Next: if norm_topk_prob); a shared expert, sigmoid-gated
        fields.update(experts=text.int("num_experts"), experts_per_token=text.int("num_experts_per_tok"),
                      expert_renorm=text.bool("norm_topk_prob", True) if model_type == "qwen3_next" else True,
                      shared_expert_ffn=text.int("shared_expert_intermediate_size"), shared_expert_gated=True)
        if model_type == "qwen3_next":
            fields.update(_dense_blocks(text, blocks))
    heads, hidden, head_dim = fields["heads"], fields["hidden"], text.int("head_dim")
    bias = text.bool("attention_bias", False)
    linear = _linear_blocks(text, blocks)
    return {**fields, "qkv_bias": bias, "out_bias": bias, "mlp_bias": False, "qk_norm": True, "norm_offset": True,
            "attention_gate": True, "head_dim_override": head_dim if head_dim * heads != hidden else 0,
            "rotary_fraction": phi3.rotary_fraction(text, 0.25),
            "linear_blocks": linear,
            **({"linear_key_heads": text.int("linear_num_key_heads"),
                "linear_value_heads": text.int("linear_num_value_heads"),
                "linear_key_dim": text.int("linear_key_head_dim"),
                "linear_value_dim": text.int("linear_value_head_dim"),
                "linear_conv": text.int("linear_conv_kernel_dim")} if linear else {})}


def to_hf(spec: ModelSpec) -> dict:
    """A qwen3_5_text (qwen3_5_moe_text) config: the language model, also of a multimodal checkpoint; or a
    qwen3_next one."""
    next_ = spec.family == "qwen3_next"
    model_type = "qwen3_next" if next_ else "qwen3_5_moe_text" if spec.experts else "qwen3_5_text"
    experts = ((spec.expert_renorm or next_) and spec.shared_expert_ffn and spec.shared_expert_gated and not
               spec.router_sigmoid and not spec.router_bias and not spec.glu_limit and
               (next_ or not spec.dense_blocks)) if spec.experts else not next_
    if not (spec.attention_gate and spec.norm_offset and spec.qk_norm and spec.gated_mlp and experts) or \
            spec.qk_norm_full or spec.qk_norm_per_head or spec.windows or spec.nope_blocks or spec.mlp_bias or \
            spec.qkv_bias != spec.out_bias or spec.rotary_interleaved or spec.rope_scaling:
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: its layers differ from "
                          f"{model_type}'s")
    linear = set(spec.linear_blocks)
    cfg = {
        "model_type": model_type, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups, "head_dim": spec.head_dim,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "rms_norm_eps": spec.norm_eps,
        "hidden_act": ACTIVATION_TO_HF[spec.activation], "attention_bias": spec.qkv_bias,
        "rope_parameters": {**llama.hf_rope(spec), "partial_rotary_factor": spec.rotary_fraction},
        "layer_types": ["linear_attention" if i in linear else "full_attention" for i in range(spec.num_blocks)],
        "tie_word_embeddings": spec.tied_embeddings, "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
    }
    if spec.experts:
        del cfg["intermediate_size"]
        cfg.update(num_experts=spec.experts, num_experts_per_tok=spec.experts_per_token,
                   moe_intermediate_size=spec.ffn_hidden, shared_expert_intermediate_size=spec.shared_expert_ffn,
                   output_router_logits=False)
    if next_:
        cfg.update(norm_topk_prob=spec.expert_renorm, decoder_sparse_step=1, mlp_only_layers=list(spec.dense_blocks),
                   intermediate_size=spec.dense_ffn or NEXT_DEFAULTS["intermediate_size"])
    if linear:
        cfg.update(linear_num_key_heads=spec.linear_key_heads, linear_num_value_heads=spec.linear_value_heads,
                   linear_key_head_dim=spec.linear_key_dim, linear_value_head_dim=spec.linear_value_dim,
                   linear_conv_kernel_dim=spec.linear_conv)
    return cfg


_LAYER = "model.layers.{i}."
_DELTA = _LAYER + "linear_attn."
WEIGHTS = replace(llama.WEIGHTS, block=tuple(
    WeightRule(r.ours, r.hf, "qkv_gated")
    if r.ours.startswith("self_attention.linear_qkv.") else r for r in llama.WEIGHTS.block) + (
    WeightRule("linear_attention.linear_qkv.weight", (_DELTA + "in_proj_qkv.weight",), "delta_qkv"),
    WeightRule("linear_attention.conv.weight", (_DELTA + "conv1d.weight",), "delta_qkv"),
    WeightRule("linear_attention.linear_z.weight", (_DELTA + "in_proj_z.weight",)),
    WeightRule("linear_attention.linear_b.weight", (_DELTA + "in_proj_b.weight",)),
    WeightRule("linear_attention.linear_a.weight", (_DELTA + "in_proj_a.weight",)),
    WeightRule("linear_attention.dt_bias", (_DELTA + "dt_bias",)),
    WeightRule("linear_attention.A_log", (_DELTA + "A_log",)),
    WeightRule("linear_attention.out_norm.weight", (_DELTA + "norm.weight",)),
    WeightRule("linear_attention.linear_proj.weight", (_DELTA + "out_proj.weight",))))

FAMILY = Family("qwen3_5", ("qwen3_5_text",), from_hf, to_hf, WEIGHTS)
# the MLP's rules replaced by Qwen2-MoE's: the router, each expert's tensors, the gated shared expert
MOE_WEIGHTS = replace(WEIGHTS, block=tuple(r for r in WEIGHTS.block if not r.ours.startswith("mlp.")) + tuple(
    r for r in moe.QWEN2_MOE.weights.block if r.ours.startswith("mlp.")))
MOE_FAMILY = Family("qwen3_5_moe", ("qwen3_5_moe_text",), from_hf, to_hf, MOE_WEIGHTS)
# Qwen3-Next: DeltaNet's projections as spans of two grouped tensors; dense blocks with LLaMA's MLP rules
_SPANS = {"linear_attention.linear_qkv.weight": ("in_proj_qkvz", "qkvz_qkv"),
          "linear_attention.linear_z.weight": ("in_proj_qkvz", "qkvz_z"),
          "linear_attention.linear_b.weight": ("in_proj_ba", "ba_b"),
          "linear_attention.linear_a.weight": ("in_proj_ba", "ba_a")}
NEXT_WEIGHTS = replace(MOE_WEIGHTS, block=tuple(
    WeightRule(r.ours, (_DELTA + _SPANS[r.ours][0] + ".weight",), _SPANS[r.ours][1]) if r.ours in _SPANS else
    replace(r, blocks="sparse") if r.ours.startswith("mlp.") else r for r in MOE_WEIGHTS.block) + tuple(
    replace(r, blocks="dense") for r in llama.WEIGHTS.block if r.ours.startswith("mlp.")))
NEXT_FAMILY = Family("qwen3_next", ("qwen3_next",), from_hf, to_hf, NEXT_WEIGHTS)
