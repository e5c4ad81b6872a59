"""GLM-4.5 (model_type glm4_moe: GLM-4.5, GLM-4.5-Air, GLM-4.6): grouped-query attention with q/k/v biases,
rotary positions on the first half of each head (halves rotated, not adjacent pairs as GLM-4's: transformers'
GPT-NeoX rotation; partial_rotary_factor, 0.5 by default), optionally Qwen3's per-head q/k RMSNorms (use_qk_norm),
and DeepSeek-V3's mixture of experts: a sigmoid router with fixed score biases and expert groups, shared experts
without a gate, dense first blocks (deepseek.py). Its multi-token prediction layers are not trained, as in
transformers. Refused: quantizations other than block-scaled FP8, output_router_logits (moe.py). Ignored, as
transformers ignores them: windows (sliding_window, layer_types) and mlp_bias.
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import HF_DEFAULTS, Family, deepseek, llama, moe, phi3
from planner.specs.model import ModelSpec

DEFAULTS = HF_DEFAULTS["glm4_moe"]  # transformers' Glm4MoeConfig defaults (5.24), merged into every config read


def from_hf(cfg, model_type: str) -> dict:
    deepseek.refuse_quantization(cfg)
    moe.refuse_router_logits(cfg)
    fields = llama.from_hf(cfg, "llama")  # heads, widths, head_dim, rotary base and scaling, read alike
    # (transformers' glm4_moe reads no window and no mlp_bias: its blocks attend to every token, its MLPs have none)
    fields.update(windows=(), qkv_bias=cfg.bool("attention_bias", False), out_bias=False, mlp_bias=False,
                  qk_norm=cfg.bool("use_qk_norm", False), rotary_fraction=phi3.rotary_fraction(cfg, 0.5),
                  **deepseek.sigmoid_experts(cfg, DEFAULTS, fields["num_blocks"]))
    return fields


def to_hf(spec: ModelSpec) -> dict:
    if not (spec.router_sigmoid and spec.expert_score_bias) or spec.latent or spec.out_bias or spec.mlp_bias or \
            spec.rotary_interleaved or spec.windows or spec.nope_blocks or spec.qk_norm_full or spec.qk_norm_per_head:
        raise SailorError(f"{spec.name} cannot be written as a glm4_moe config: its layers differ from glm4_moe's")
    cfg = llama.to_hf(replace(spec, hf_model_type="qwen3" if spec.qk_norm else "llama", experts=0, experts_per_token=0,
                              shared_expert_ffn=0, router_sigmoid=False, expert_score_bias=False, expert_groups=1,
                              expert_groups_per_token=1, routed_scale=1.0, dense_blocks=(), dense_ffn=0,
                              out_bias=spec.qkv_bias))
    for key in ("mlp_bias", "sliding_window", "layer_types", "use_sliding_window"):
        cfg.pop(key, None)
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "partial_rotary_factor": spec.rotary_fraction}
    cfg.update(model_type="glm4_moe", attention_bias=spec.qkv_bias, use_qk_norm=spec.qk_norm,
               **deepseek.experts_to_hf(spec, "glm4_moe"))
    return cfg


# LLaMA's attention tensors, biases and q/k norms, DeepSeek-V3's experts
WEIGHTS = replace(llama.WEIGHTS, block=(*(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp.")),
                                        *deepseek.EXPERT_RULES))

FAMILY = Family("glm4_moe", ("glm4_moe",), from_hf, to_hf, WEIGHTS)
