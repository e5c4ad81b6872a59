"""GLM-4.5 (model_type glm4_moe: GLM-4.5, GLM-4.5-Air, GLM-4.6): grouped-query attention with q/k/v biases,
rotary positions on the first half of each head (halves rotated, not adjacent pairs as GLM-4's: transformers'
GPT-NeoX rotation; partial_rotary_factor, 0.5 by default), optionally Qwen3's per-head q/k RMSNorms (use_qk_norm),
and DeepSeek-V3's mixture of experts: a sigmoid router with fixed score biases and expert groups, shared experts
without a gate, dense first blocks (deepseek.py). Its multi-token prediction layers are not trained, as in
transformers. Refused: quantizations other than block-scaled FP8, output_router_logits (moe.py). Ignored, as
transformers ignores them: windows (sliding_window, layer_types) and mlp_bias.

Solar Open (model_type solar_open) is GLM-4.5 with experts on every block, LLaMA's attention (whole heads rotated
by halves) and no q/k norms: transformers reads neither first_k_dense_replace nor use_qk_norm from its config.
dots.llm1 (model_type dots1) is GLM-4.5 with Qwen3's attention: q/k norms always, whole heads rotated, a bias on the
output projection with q/k/v's, and windows on the blocks its layer_types names (by default those from
max_window_layers on).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import HF_DEFAULTS, ConfigReader, Family, deepseek, llama, moe, phi3
from planner.specs.model import ModelSpec

DEFAULTS = HF_DEFAULTS["glm4_moe"]  # transformers' Glm4MoeConfig defaults (5.24), merged into every config read
WHOLE_HEADS = ("solar_open", "dots1")  # LLaMA's or Qwen3's rotary positions, on the whole of each head


def from_hf(cfg, model_type: str) -> dict:
    deepseek.refuse_quantization(cfg)
    moe.refuse_router_logits(cfg)
    dots1 = model_type == "dots1"
    if model_type == "solar_open":  # (fields transformers' SolarOpenConfig does not have)
        cfg = ConfigReader({**cfg.cfg, "first_k_dense_replace": 0, "use_qk_norm": False,  # (and no dense MLP: the
                            "intermediate_size": cfg.cfg.get("moe_intermediate_size")}, cfg.source)  # experts' width)
    if dots1:  # (Qwen3's attention: always q/k norms)
        cfg = ConfigReader({**cfg.cfg, "use_qk_norm": True}, cfg.source)
    if model_type in WHOLE_HEADS and phi3.rotary_fraction(cfg) != 1:
        raise SailorError(f"model config {cfg.source}: {model_type} rotates whole heads; remove "
                          f"partial_rotary_factor {short(phi3.rotary_fraction(cfg))}")
    fields = llama.from_hf(cfg, "llama")  # heads, widths, head_dim, rotary base and scaling, read alike
    # (transformers' glm4_moe reads no window and no mlp_bias: its blocks attend to every token, its MLPs have none;
    # dots.llm1 windows as its layer_types say and has the output projection's bias with q/k/v's)
    bias = cfg.bool("attention_bias", False)
    fields.update(windows=llama._windows(cfg, model_type, fields["num_blocks"]) if dots1 else (), qkv_bias=bias,
                  out_bias=bias and dots1, mlp_bias=False, qk_norm=cfg.bool("use_qk_norm", False),
                  rotary_fraction=phi3.rotary_fraction(cfg, 1 if model_type in WHOLE_HEADS else 0.5),
                  **deepseek.sigmoid_experts(cfg, {**DEFAULTS, **HF_DEFAULTS[model_type]}, fields["num_blocks"]))
    return fields


def to_hf(spec: ModelSpec) -> dict:
    model_type = spec.hf_model_type or "glm4_moe"
    dots1 = model_type == "dots1"
    if not (spec.router_sigmoid and spec.expert_score_bias) or spec.latent or spec.mlp_bias or \
            spec.out_bias != (spec.qkv_bias and dots1) or spec.rotary_interleaved or spec.windows and not dots1 or \
            spec.nope_blocks or spec.qk_norm_full or spec.qk_norm_per_head or \
            model_type == "solar_open" and (spec.dense_blocks or spec.qk_norm) or dots1 and not spec.qk_norm or \
            model_type in WHOLE_HEADS and spec.rotary_fraction != 1:
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: its layers differ from "
                          f"{model_type}'s")
    cfg = llama.to_hf(replace(spec, hf_model_type="qwen3" if spec.qk_norm else "llama", experts=0, experts_per_token=0,
                              shared_expert_ffn=0, router_sigmoid=False, expert_score_bias=False, expert_groups=1,
                              expert_groups_per_token=1, routed_scale=1.0, dense_blocks=(), dense_ffn=0,
                              out_bias=spec.qkv_bias))
    for key in ("mlp_bias", "use_sliding_window") + (() if dots1 else ("sliding_window", "layer_types")):
        cfg.pop(key, None)
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "partial_rotary_factor": spec.rotary_fraction}
    cfg.update(model_type=model_type, attention_bias=spec.qkv_bias, use_qk_norm=spec.qk_norm,
               **deepseek.experts_to_hf(spec, model_type))
    if model_type in WHOLE_HEADS:  # (fields their configs do not have)
        for key in ("use_qk_norm",) + (("intermediate_size", "first_k_dense_replace") if not dots1 else ()):
            del cfg[key]
        del cfg["rope_parameters"]["partial_rotary_factor"]
    if dots1:  # (every block's type, or its defaults would window the blocks past the 62nd)
        cfg["layer_types"] = ["sliding_attention" if w else "full_attention" for w in spec.windows] or \
            ["full_attention"] * spec.num_blocks
    return cfg


# LLaMA's attention tensors, biases and q/k norms, DeepSeek-V3's experts
WEIGHTS = replace(llama.WEIGHTS, block=(*(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp.")),
                                        *deepseek.EXPERT_RULES))

FAMILY = Family("glm4_moe", ("glm4_moe", "solar_open", "dots1"), from_hf, to_hf, WEIGHTS)
