"""Granite SWA (model_type granite_swa): Granite's blocks and multipliers with windows and attention sinks; GraniteMoE
SWA (granitemoe_swa): GraniteMoeShared's experts (and shared expert, none by default) with the same attention.

Blocks are windowed (sliding_window, 128 by default) or full as layer_types says (by default every fourth full,
from the first); every block's heads have a learned sink logit each, which joins the softmax as gpt-oss's do
(transformers scales the output by sigmoid(logsumexp(scores) - sink), the same thing). layer_rope_theta gives each
block its rotary base, 0 for none (ModelSpec.nope_blocks); the blocks with rotary positions must share one base.
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import Family, WeightRule, llama, moe
from planner.specs.model import ModelSpec

FULL_EVERY = 4  # without layer_types, blocks 0, 4, 8, ... attend to every token


def from_hf(cfg, model_type: str) -> dict:
    fields = moe.from_hf(cfg, "granitemoeshared") if model_type == "granitemoe_swa" else llama.from_hf(cfg, "granite")
    blocks = fields["num_blocks"]
    types = cfg.cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if i % FULL_EVERY else "full_attention" for i in range(blocks)]
    llama.check_layer_types(cfg, types, blocks)
    width = cfg.int("sliding_window") if "sliding_attention" in types else 0
    thetas = cfg.cfg.get("layer_rope_theta")
    if thetas is None:
        thetas = [fields["rope_theta"]] * blocks
    if not isinstance(thetas, list) or len(thetas) != blocks or \
            any(isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < 1e30 for t in thetas):
        raise SailorError(f"model config {cfg.source}: layer_rope_theta must list a rotary base >= 0 (0: none) for "
                          f"each of the {blocks} layers, not {short(thetas)}")
    bases = {float(t) for t in thetas if t}
    if len(bases) > 1:
        raise SailorError(f"model config {cfg.source}: layer_rope_theta gives blocks different rotary bases "
                          f"{sorted(bases)}, which sailor does not support; give them one base (0 for none)")
    return {**fields, "windows": tuple(width if t == "sliding_attention" else 0 for t in types),
            "attention_sinks": True, "nope_blocks": tuple(i for i, t in enumerate(thetas) if not t),
            "rope_theta": bases.pop() if bases else fields["rope_theta"]}


def to_hf(spec: ModelSpec) -> dict:
    windows = {w for w in spec.windows if w}
    if not spec.attention_sinks or len(windows) > 1:
        raise SailorError(f"{spec.name} cannot be written as a granite_swa config: its blocks have no attention "
                          "sinks or different windows")
    dense = replace(spec, windows=(), nope_blocks=(), attention_sinks=False)
    cfg = moe.to_hf(replace(dense, hf_model_type="granitemoeshared")) if spec.experts else \
        llama.to_hf(replace(dense, hf_model_type="granite"))
    model_type = spec.hf_model_type or ("granitemoe_swa" if spec.experts else "granite_swa")
    return {**cfg, "model_type": model_type, "sliding_window": windows.pop() if windows else None,
            "layer_types": ["sliding_attention" if spec.window(b) else "full_attention"
                            for b in range(spec.num_blocks)],
            "layer_rope_theta": [0.0 if b in spec.nope_blocks else spec.rope_theta for b in range(spec.num_blocks)]}


# LLaMA's tensors and the sinks
WEIGHTS = replace(llama.WEIGHTS, block=(*llama.WEIGHTS.block, WeightRule("self_attention.core_attention.sinks",
                                                                         ("model.layers.{i}.self_attn.sinks",))))

FAMILY = Family("granite_swa", ("granite_swa",), from_hf, to_hf, WEIGHTS)
_MOE = "model.layers.{i}.block_sparse_moe."
# GraniteMoeShared's attention and shared expert with the sinks; its experts as transformers 5 keeps them (fused, gate
# rows then up rows)
MOE_FAMILY = Family("granitemoe_swa", ("granitemoe_swa",), from_hf, to_hf, replace(moe.GRANITE_MOE.weights, block=(
    *(r for r in moe.GRANITE_MOE.weights.block if not r.ours.startswith(("mlp.router", "mlp.linear_fc"))),
    WEIGHTS.block[-1],  # (the sinks)
    WeightRule("mlp.router.weight", (_MOE + "router.weight",)),
    WeightRule("mlp.linear_fc1.weight", (_MOE + "experts.gate_up_proj",), "experts_gate_up_cat"),
    WeightRule("mlp.linear_fc2.weight", (_MOE + "experts.down_proj",)))))
