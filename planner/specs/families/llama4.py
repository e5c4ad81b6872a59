"""Llama 4 (model_type llama4_text, and the language model of the multimodal llama4: Llama-4-Scout-17B-16E,
Llama-4-Maverick-17B-128E).

LLaMA's blocks with:
  * a mixture of experts on the blocks in moe_layers (by default every interleave_moe_layer_step-th: all of
    Scout's, every other of Maverick's), the others a dense MLP intermediate_size_mlp wide. The router takes
    each token's top num_experts_per_tok logits and weighs them by their sigmoids; the weight scales the
    expert's input, not its output (ModelSpec.expert_input_weighted). A shared expert, ungated, as wide as
    each expert (intermediate_size). Checkpoints hold each block's experts in two tensors as x @ W:
    gate_up_proj [E, h, 2 ffn] (the gate's columns, then up's) and down_proj [E, ffn, h].
  * blocks without rotary positions (no_rope_layers: 0; by default every fourth), where q is scaled by
    1 + attn_scale ln(1 + floor((p + 1) / floor_scale)) at position p (attn_temperature_tuning), and blocks
    with them, which rotate adjacent pairs, divide each head's q and k by their RMS without a weight
    (use_qk_norm) and attend within chunks of attention_chunk_size tokens.
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ConfigReader, Family, WeightMap, WeightRule, llama, moe
from planner.specs.model import MAX_BLOCKS, ModelSpec

# transformers' Llama4TextConfig defaults (5.24; Llama-4-Scout's shape) for fields a config leaves out
DEFAULTS = {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "num_experts_per_tok": 1, "num_local_experts": 16, "attention_chunk_size": 8192, "floor_scale": 8192,
            "attn_scale": 0.1}
LAYER_TYPES = ("full_attention", "chunked_attention")


def _moe_blocks(cfg, blocks: int) -> list[int]:
    listed = cfg.cfg.get("moe_layers")
    if listed is None:
        step = cfg.int("interleave_moe_layer_step", 1)
        return list(range(step - 1, blocks, step))
    if not isinstance(listed, list) or any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < blocks
                                           for b in listed):
        raise SailorError(f"model config {cfg.source}: moe_layers must list block indices from 0 to {blocks - 1}, "
                          f"not {short(listed)}")
    return listed


def from_hf(cfg, model_type: str) -> dict:
    cfg = ConfigReader({**DEFAULTS, **cfg.cfg}, cfg.source)
    moe.refuse_router_logits(cfg)
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)
    flags = cfg.cfg.get("no_rope_layers") or None  # (an empty list is transformers' default too)
    nope = llama._nope_blocks(ConfigReader({**cfg.cfg, "no_rope_layers": flags}, cfg.source), blocks)
    chunk = cfg.cfg.get("attention_chunk_size")
    chunk = 0 if chunk is None else cfg.int("attention_chunk_size")
    expected = ["chunked_attention" if chunk and i not in nope else "full_attention" for i in range(blocks)]
    if cfg.cfg.get("layer_types") not in (None, expected):
        raise SailorError(f"model config {cfg.source}: layer_types must put chunked attention on the blocks with "
                          f"rotary positions (when attention_chunk_size is set) and full attention on the others, "
                          f"{short(expected)}; remove layer_types")
    sparse = set(_moe_blocks(cfg, blocks))
    dense = tuple(i for i in range(blocks) if i not in sparse)
    # LLaMA's fields (heads, widths, rotary base), the MLP's width an expert's
    fields = llama.from_hf(ConfigReader({**cfg.cfg, "layer_types": None, "sliding_window": None}, cfg.source),
                           "llama")
    head_dim = cfg.int("head_dim")
    tuning = cfg.bool("attn_temperature_tuning", True)
    fields.update(
        experts=cfg.int("num_local_experts"), experts_per_token=cfg.int("num_experts_per_tok"), expert_renorm=False,
        router_sigmoid=True, expert_input_weighted=True, shared_expert_ffn=fields["ffn_hidden"],
        shared_expert_gated=False, rotary_interleaved=True, nope_blocks=nope, qk_l2_norm=cfg.bool("use_qk_norm", True),
        attention_chunk=chunk, head_dim_override=head_dim if head_dim * fields["heads"] != fields["hidden"] else 0,
        **({"dense_blocks": dense, "dense_ffn": cfg.int("intermediate_size_mlp")} if dense else {}),
        **({"query_scale_beta": cfg.float("attn_scale", 0.1), "query_scale_span": cfg.int("floor_scale"),
            "query_scale_offset": 1, "query_scale_nope": True} if tuning else {}))
    return fields


def to_hf(spec: ModelSpec) -> dict:
    tuning = spec.query_scale_beta > 0
    fits = spec.experts and spec.router_sigmoid and spec.expert_input_weighted and not spec.expert_renorm and \
        spec.shared_expert_ffn == spec.ffn_hidden and not spec.shared_expert_gated and spec.rotary_interleaved and \
        not spec.qk_norm and not spec.windows and not spec.expert_score_bias and spec.expert_groups == 1 and \
        spec.routed_scale == 1 and not spec.router_bias and not spec.mlp_bias and spec.qkv_bias == spec.out_bias and \
        (not tuning or (spec.query_scale_nope and spec.query_scale_offset == 1))
    if not fits:
        raise SailorError(f"{spec.name} cannot be written as a llama4_text config: its layers differ from Llama 4's")
    cfg = llama.to_hf(replace(spec, hf_model_type="llama", experts=0, experts_per_token=0, router_sigmoid=False,
                              expert_input_weighted=False, shared_expert_ffn=0, rotary_interleaved=False,
                              nope_blocks=(), dense_blocks=(), dense_ffn=0, qk_l2_norm=False, attention_chunk=0,
                              query_scale_beta=0.0, query_scale_span=0, query_scale_offset=0, query_scale_nope=False))
    del cfg["mlp_bias"]
    nope = set(spec.nope_blocks)
    cfg.update(
        model_type="llama4_text", num_local_experts=spec.experts, num_experts_per_tok=spec.experts_per_token,
        intermediate_size_mlp=spec.dense_ffn or spec.ffn_hidden,
        moe_layers=[i for i in range(spec.num_blocks) if i not in spec.dense_blocks],
        no_rope_layers=[int(i not in nope) for i in range(spec.num_blocks)], use_qk_norm=spec.qk_l2_norm,
        attention_chunk_size=spec.attention_chunk or None,
        layer_types=["chunked_attention" if spec.attention_chunk and i not in nope else "full_attention"
                     for i in range(spec.num_blocks)],
        attn_temperature_tuning=tuning, attn_scale=spec.query_scale_beta if tuning else 0.1,
        floor_scale=spec.query_scale_span if tuning else 8192)
    return cfg


_LAYER = "model.layers.{i}."
_FF = _LAYER + "feed_forward."
WEIGHTS = WeightMap(
    embedding=llama.WEIGHTS.embedding,
    block=(*(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp.")),
           WeightRule("mlp.linear_fc1.weight", (_FF + "gate_proj.weight", _FF + "up_proj.weight"), "gate_up", "dense"),
           WeightRule("mlp.linear_fc2.weight", (_FF + "down_proj.weight",), blocks="dense"),
           WeightRule("mlp.router.weight", (_FF + "router.weight",), blocks="sparse"),
           WeightRule("mlp.linear_fc1.weight", (_FF + "experts.gate_up_proj",), "experts_gate_up_t", "sparse"),
           WeightRule("mlp.linear_fc2.weight", (_FF + "experts.down_proj",), "experts_t", "sparse"),
           WeightRule("mlp.shared_expert.linear_fc1.weight", (_FF + "shared_expert.gate_proj.weight",
                                                              _FF + "shared_expert.up_proj.weight"), "gate_up",
                      "sparse"),
           WeightRule("mlp.shared_expert.linear_fc2.weight", (_FF + "shared_expert.down_proj.weight",),
                      blocks="sparse")),
    final_norm=llama.WEIGHTS.final_norm,
    head=llama.WEIGHTS.head,
)
FAMILY = Family("llama4", ("llama4_text",), from_hf, to_hf, WEIGHTS)
