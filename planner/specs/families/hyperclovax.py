"""HyperCLOVA X (model_type hyperclovax: NAVER's HyperCLOVA X SEED): Granite's blocks and multipliers with
Peri-LN, a norm on each sublayer's output as well as before it (use_post_norm; ModelSpec.sandwich_norm), the
normalised output then scaled by residual_multiplier. Unlike Granite it multiplies the logits by logits_scaling
(ModelSpec.logits_divisor = 1 / logits_scaling), and its attention scale defaults to 1/sqrt(head_dim).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import Family, WeightRule, llama
from planner.specs.model import ModelSpec

_LAYER = "model.layers.{i}."


def from_hf(cfg, model_type: str) -> dict:
    fields = llama.from_hf(cfg, "granite")
    head_dim = fields["head_dim_override"] or fields["hidden"] // fields["heads"]
    scale = fields["attention_scale"]
    return {**fields, "sandwich_norm": cfg.bool("use_post_norm", True),
            # (transformers saves the default's value; a head_dim of 0 is refused by ModelSpec)
            "attention_scale": 0.0 if head_dim and scale == head_dim ** -0.5 else scale,
            "logits_divisor": 1.0 / cfg.float("logits_scaling", 1.0)}


def to_hf(spec: ModelSpec) -> dict:
    if spec.parallel_residual or not spec.input_norms:
        raise SailorError(f"{spec.name} cannot be written as a hyperclovax config: its layers differ from "
                          "HyperCLOVA X's")
    cfg = llama.to_hf(replace(spec, hf_model_type="granite", sandwich_norm=False))
    return {**cfg, "model_type": "hyperclovax", "use_post_norm": spec.sandwich_norm,
            "logits_scaling": 1.0 / spec.logits_divisor}


# LLaMA's tensors, with the norms on the sublayers' outputs
WEIGHTS = replace(llama.WEIGHTS, block=(*llama.WEIGHTS.block,
                                        WeightRule("post_attention_layernorm.weight", (_LAYER + "post_norm1.weight",)),
                                        WeightRule("post_mlp_layernorm.weight", (_LAYER + "post_norm2.weight",))))

FAMILY = Family("hyperclovax", ("hyperclovax",), from_hf, to_hf, WEIGHTS)
