"""HunYuan (Tencent): dense (model_type hunyuan_v1_dense: Hunyuan-0.5B to 7B) and with experts (hunyuan_v1_moe:
Hunyuan-A13B).

LLaMA's blocks whose per-head q and k RMSNorms come after the rotary positions, not before them as Qwen3's
(ModelSpec.qk_norm_after_rotary; the runtime applies them in sailor_ext.attention.FusedCoreAttention). Its
published configs stretch the rotary base by NTK alpha: rope type dynamic with an alpha reads as base * alpha^(d /
(d - 2)), d the head dimension, for every sequence (rope type ntk_alpha here, written back as dynamic with the
alpha). With experts, every block's MLP is num_experts experts intermediate_size wide, moe_topk of them per token
chosen by their softmax probabilities and weighed by those renormalised, beside one shared MLP as wide, ungated.
transformers' HunYuan takes a number of experts and a top-k per block; one value for all is read.
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ConfigReader, Family, WeightRule, llama, moe
from planner.specs.model import ModelSpec

DENSE, MOE = "hunyuan_v1_dense", "hunyuan_v1_moe"


def _per_model(cfg, key: str, default: int) -> int:
    """num_experts or moe_topk: one whole number, or a list of one value per block that are all the same."""
    value = cfg.cfg.get(key, default)
    if isinstance(value, list) and value and len(set(map(repr, value))) == 1:
        value = value[0]
    if isinstance(value, list):
        raise SailorError(f"model config {cfg.source}: {key} differs between blocks ({short(value)}), which sailor "
                          "does not train; give one value for every block")
    return ConfigReader({key: value}, cfg.source).int(key, default)


def from_hf(cfg, model_type: str) -> dict:
    moe.refuse_router_logits(cfg)
    # (LLaMA's attention, biases on q, k, v and the output projection with attention_bias; MLPs without)
    fields = llama.from_hf(ConfigReader({**cfg.cfg, "mlp_bias": False}, cfg.source), model_type)
    fields.update(qk_norm=True, qk_norm_after_rotary=True)
    if model_type == MOE:
        fields.update(experts=_per_model(cfg, "num_experts", 1), experts_per_token=_per_model(cfg, "moe_topk", 1),
                      expert_renorm=True, shared_expert_ffn=fields["ffn_hidden"], shared_expert_gated=False,
                      router_fp32=True)  # (transformers builds its router in fp32)
    return fields


def to_hf(spec: ModelSpec) -> dict:
    model_type = spec.hf_model_type or (MOE if spec.experts else DENSE)
    if not spec.qk_norm_after_rotary or spec.qkv_bias != spec.out_bias or spec.windows or spec.nope_blocks or \
            spec.rotary_fraction != 1 or (model_type == MOE) != bool(spec.experts) or spec.experts and (
                spec.shared_expert_ffn != spec.ffn_hidden or spec.shared_expert_gated or not spec.expert_renorm or
                spec.router_sigmoid or spec.expert_score_bias or spec.dense_blocks or spec.routed_scale != 1):
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: its layers differ from "
                          f"{model_type}'s")
    cfg = llama.to_hf(replace(spec, hf_model_type="llama", qk_norm=False, qk_norm_after_rotary=False, experts=0,
                              experts_per_token=0, shared_expert_ffn=0))
    cfg.pop("mlp_bias")
    cfg["model_type"] = model_type
    if model_type == MOE:
        cfg.update(num_experts=spec.experts, moe_topk=spec.experts_per_token, output_router_logits=False)
    return cfg


_LAYER = "model.layers.{i}."
_NORMS = {"self_attention.q_layernorm.weight": "self_attn.query_layernorm.weight",
          "self_attention.k_layernorm.weight": "self_attn.key_layernorm.weight"}
# LLaMA's tensors with the q/k norms' names of HunYuan's
WEIGHTS = replace(llama.WEIGHTS, block=tuple(replace(r, hf=(_LAYER + _NORMS[r.ours],)) if r.ours in _NORMS else r
                                             for r in llama.WEIGHTS.block))
# with experts: the router (wg), the experts one tensor each, the shared MLP
MOE_WEIGHTS = replace(WEIGHTS, block=(
    *(r for r in WEIGHTS.block if not r.ours.startswith("mlp.")),
    WeightRule("mlp.router.weight", (_LAYER + "mlp.gate.wg.weight",)),
    WeightRule("mlp.linear_fc1.weight", (_LAYER + "mlp.experts.{e}.gate_proj.weight",
                                         _LAYER + "mlp.experts.{e}.up_proj.weight"), "experts_gate_up"),
    WeightRule("mlp.linear_fc2.weight", (_LAYER + "mlp.experts.{e}.down_proj.weight",), "experts"),
    WeightRule("mlp.shared_expert.linear_fc1.weight", (_LAYER + "mlp.shared_mlp.gate_proj.weight",
                                                       _LAYER + "mlp.shared_mlp.up_proj.weight"), "gate_up"),
    WeightRule("mlp.shared_expert.linear_fc2.weight", (_LAYER + "mlp.shared_mlp.down_proj.weight",))))

FAMILY = Family("hunyuan", (DENSE,), from_hf, to_hf, WEIGHTS)
MOE_FAMILY = Family("hunyuan_moe", (MOE,), from_hf, to_hf, MOE_WEIGHTS)
