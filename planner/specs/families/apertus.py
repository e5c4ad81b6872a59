"""Apertus (model_type apertus: the Swiss AI Initiative's Apertus 8B and 70B): LLaMA's attention with Qwen3's
per-head q/k norms, pre-norms under names of their own, and an ungated MLP whose activation is xIELU by default.

xIELU (ModelSpec.activation "xielu"; sailor_ext.model.XIELU) has two trained scalars per block, alpha_p and
alpha_n, and two fixed ones, beta and eps, kept in the checkpoint: x > 0 gives softplus(alpha_p) x^2 + beta x,
else (expm1(min(x, eps)) - x) (beta + softplus(alpha_n)) + beta x. Its rotary positions default to LLaMA 3.1's
scaling (base 12,000,000, factor 8 over 8,192 tokens).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import Family, WeightRule, llama
from planner.specs.model import ModelSpec


def from_hf(cfg, model_type: str) -> dict:
    fields = llama.from_hf(cfg, model_type)  # (its attention biases on q, k, v and the output; no windows)
    return {**fields, "gated_mlp": False, "mlp_bias": False, "qk_norm": True,
            "activation": cfg.activation("hidden_act", "xielu")}


def to_hf(spec: ModelSpec) -> dict:
    if spec.gated_mlp or spec.mlp_bias or not spec.qk_norm or spec.qk_norm_full or spec.qk_norm_per_head or \
            spec.qk_norm_after_rotary or spec.qkv_bias != spec.out_bias or spec.windows or spec.nope_blocks or \
            spec.experts or spec.rotary_interleaved or spec.rotary_fraction != 1:
        raise SailorError(f"{spec.name} cannot be written as an apertus config: its layers differ from Apertus's")
    cfg = llama.to_hf(replace(spec, hf_model_type="llama", qk_norm=False))
    cfg.pop("mlp_bias")
    return {**cfg, "model_type": "apertus"}


_LAYER = "model.layers.{i}."
_NAMES = {"input_layernorm.weight": "attention_layernorm.weight", "pre_mlp_layernorm.weight":
          "feedforward_layernorm.weight", "mlp.linear_fc1.weight": "mlp.up_proj.weight",
          "mlp.linear_fc2.weight": "mlp.down_proj.weight"}
# LLaMA's attention and q/k norms (Qwen3's names), its pre-norms and ungated MLP renamed, xIELU's scalars
WEIGHTS = replace(llama.WEIGHTS, block=(
    *(replace(r, hf=(_LAYER + _NAMES[r.ours],), op="copy") if r.ours in _NAMES else r for r in llama.WEIGHTS.block
      if not r.ours.startswith("mlp.") or r.ours in _NAMES),
    *(WeightRule(f"mlp.activation_func.{p}", (f"{_LAYER}mlp.act_fn.{p}",)) for p in ("alpha_p", "alpha_n", "beta",
                                                                                       "eps"))))

FAMILY = Family("apertus", ("apertus",), from_hf, to_hf, WEIGHTS)
