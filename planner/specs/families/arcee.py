"""Arcee (model_type arcee: AFM-4.5B): LLaMA's attention with a plain MLP, up_proj -> ReLU squared
(relu2, its default activation) -> down_proj, no gate."""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import Family, WeightRule, llama
from planner.specs.model import ModelSpec

_LAYER = "model.layers.{i}."


def from_hf(cfg, model_type: str) -> dict:
    return {**llama.from_hf(cfg, "llama"), "gated_mlp": False, "activation": cfg.activation("hidden_act", "relu2")}


def to_hf(spec: ModelSpec) -> dict:
    if spec.gated_mlp:
        raise SailorError(f"{spec.name} cannot be written as an arcee config: its MLP is gated")
    return {**llama.to_hf(replace(spec, hf_model_type="llama")), "model_type": "arcee"}


# LLaMA's tensors, fc1 being up_proj alone
WEIGHTS = replace(llama.WEIGHTS, block=tuple(
    WeightRule("mlp.linear_fc1.weight", (_LAYER + "mlp.up_proj.weight",)) if r.ours == "mlp.linear_fc1.weight" else
    WeightRule("mlp.linear_fc1.bias", (_LAYER + "mlp.up_proj.bias",)) if r.ours == "mlp.linear_fc1.bias" else r
    for r in llama.WEIGHTS.block))

FAMILY = Family("arcee", ("arcee",), from_hf, to_hf, WEIGHTS)
