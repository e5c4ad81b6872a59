"""OLMo 1, 2 and 3. OLMo 2 and 3: LLaMA's blocks with the norms moved after the sublayers, and q/k norms across all
heads.

A block is x + norm(attn(x)), then x + norm(mlp(x)): no norm before a sublayer (ModelSpec
input_norms False, sandwich_norm True). q and k are normalised before the rotary positions by one
RMSNorm each over all heads together, width heads * head_dim (kv_heads * head_dim for k), not per
head as Qwen3's (qk_norm_full). OLMo 3 windows three blocks in four (layer_types) and gives the
windowed blocks a rotary base of their own, unscaled (rope_parameters per layer type, as Gemma 3).
OLMoE shares OLMo 2's attention and has LLaMA's pre-norms: it is a mixture of experts (moe.py).

OLMo 1 (model_type olmo: OLMo-1B and 7B, OLMo 1.7) is LLaMA with LayerNorms that have no weight and no bias
(ModelSpec.norm_weight), their epsilon 1e-5 whatever the config says, biases on every attention projection or
none (attention_bias), and q, k and v clamped to [-clip_qkv, clip_qkv] after their projection where set (OLMo 1.7).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ACTIVATION_TO_HF, ConfigReader, Family, WeightRule, llama
from planner.specs.model import MAX_BLOCKS, ModelSpec

_LAYER = "model.layers.{i}."
PAD_TOKEN = 1  # pad_token_id of OLMo 2's and OLMoE's configs when theirs has none (its row is never trained)
OLMO3_PATTERN = 4  # OLMo 3 without layer_types: every 4th block full, the others windowed (transformers' default)
OLMO3_THETA = 500000.0  # OLMo 3's rotary base when its config gives none


def from_hf(cfg, model_type: str) -> dict:
    local = {}
    if model_type == "olmo3":
        cfg, local = _olmo3(cfg)
    fields = {**llama.from_hf(cfg, model_type), "qk_norm": True, "qk_norm_full": True, "input_norms": False,
              "sandwich_norm": True, "pad_token": cfg.pad_token(PAD_TOKEN)}
    if local:  # a base of their own, or unscaled where the full blocks are scaled
        theta = cfg.number("rope_theta", local.get("rope_theta", OLMO3_THETA))
        if fields["windows"] and (fields["rope_scaling"] or theta != fields["rope_theta"]):
            fields["local_rope_theta"] = theta
    return fields


def _olmo3(cfg) -> tuple[ConfigReader, dict]:
    """OLMo 3's config as llama.from_hf reads it (the full blocks' rotary parameters, transformers' default
    layer_types filled in), and the windowed blocks' rotary parameters."""
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)
    raw = dict(cfg.cfg)
    if raw.get("layer_types") is None:
        raw.update(sliding_window=raw.get("sliding_window", 4096), layer_types=[
            "sliding_attention" if (i + 1) % OLMO3_PATTERN else "full_attention" for i in range(blocks)])
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:  # rope_theta for every block, rope_scaling for the full ones (the older fields)
        theta = raw.get("rope_theta", OLMO3_THETA)
        full, local = {**(raw.get("rope_scaling") or {}), "rope_theta": theta}, {"rope_theta": theta}
    if not isinstance(full, dict) or not isinstance(local, dict):
        raise SailorError(f"model config {cfg.source}: rope_parameters must map each layer type to an object")
    if local.get("rope_type", "default") != "default":
        raise SailorError(f"model config {cfg.source}: rope type {short(local.get('rope_type'))} is not supported for "
                          "olmo3's sliding-window blocks; use default")
    if full.get("rope_type", full.get("type")) == "longrope":  # (no OLMo 3 uses it; untested)
        raise SailorError(f"model config {cfg.source}: rope type 'longrope' is not supported for olmo3; use yarn")
    raw.pop("rope_scaling", None)
    raw.update(rope_parameters={"rope_theta": OLMO3_THETA, **full})
    return ConfigReader(raw, cfg.source), local


def to_hf(spec: ModelSpec) -> dict:
    model_type = spec.hf_model_type or ("olmo3" if spec.windows else "olmo2")
    rope = llama.hf_rope(spec)
    cfg = {
        "model_type": model_type, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "max_position_embeddings": spec.context_length,
        "rms_norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation],
        "rope_parameters": rope, "attention_bias": spec.qkv_bias,
        "tie_word_embeddings": spec.tied_embeddings, "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "bos_token_id": None, "eos_token_id": None,
    }
    if model_type == "olmo2":
        if spec.windows or spec.local_rope_theta:
            raise SailorError(f"{spec.name}: olmo2's config cannot express attention windows; export it as olmo3")
        return cfg
    windows = {w for w in spec.windows if w}
    if len(windows) > 1:
        raise SailorError(f"{spec.name}: blocks use different attention windows {sorted(windows)}, which olmo3's "
                          "config cannot express")
    local = {"rope_type": "default", "rope_theta": spec.local_rope_theta or spec.rope_theta}
    types = ["sliding_attention" if spec.window(b) else "full_attention" for b in range(spec.num_blocks)]
    return {**cfg, "sliding_window": windows.pop() if windows else None, "layer_types": types,
            "rope_parameters": {"full_attention": rope, "sliding_attention": local}}


# LLaMA's tensors without the pre-norms; the output norms are post_attention_layernorm (a pre-MLP norm in
# LLaMA) and post_feedforward_layernorm
WEIGHTS = replace(llama.WEIGHTS, block=tuple(
    r for r in llama.WEIGHTS.block if r.ours not in ("input_layernorm.weight", "pre_mlp_layernorm.weight")) + (
    WeightRule("post_attention_layernorm.weight", (_LAYER + "post_attention_layernorm.weight",)),
    WeightRule("post_mlp_layernorm.weight", (_LAYER + "post_feedforward_layernorm.weight",))))

FAMILY = Family("olmo2", ("olmo2", "olmo3"), from_hf, to_hf, WEIGHTS)

OLMO1_EPS = 1e-5  # OLMo 1's LayerNorm epsilon, fixed in transformers' OlmoLayerNorm


def olmo1_from_hf(cfg, model_type: str) -> dict:
    clip = cfg.cfg.get("clip_qkv")
    return {**llama.from_hf(cfg, "llama"), "rms_norm": False, "norm_bias": False, "norm_weight": False,
            "norm_eps": OLMO1_EPS, "mlp_bias": False, "separate_final_norm": False,
            "pad_token": cfg.pad_token(PAD_TOKEN),
            "qkv_clip": 0.0 if clip is None else cfg.number("clip_qkv", clip)}


def olmo1_to_hf(spec: ModelSpec) -> dict:
    if spec.rms_norm or spec.norm_weight or not spec.gated_mlp or spec.qkv_bias != spec.out_bias or \
            spec.mlp_bias or spec.head_dim_override or spec.windows or spec.qk_norm or spec.norm_eps != OLMO1_EPS or \
            spec.parallel_residual or spec.rotary_fraction != 1 or spec.rotary_interleaved or spec.nope_blocks or \
            spec.experts or spec.sandwich_norm or spec.attention_scale or spec.head_bias:
        raise SailorError(f"{spec.name} cannot be written as an olmo config: its layers differ from OLMo 1's")
    return {
        "model_type": "olmo", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "max_position_embeddings": spec.context_length,
        "hidden_act": ACTIVATION_TO_HF[spec.activation], "rope_parameters": llama.hf_rope(spec),
        "attention_bias": spec.qkv_bias, "clip_qkv": spec.qkv_clip or None, "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None, "attention_dropout": 0.0,
    }


# LLaMA's tensors; the norms have none
OLMO1 = Family("olmo", ("olmo",), olmo1_from_hf, olmo1_to_hf, llama.WEIGHTS)
