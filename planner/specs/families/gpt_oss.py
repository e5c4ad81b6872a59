"""gpt-oss (model_type gpt_oss: gpt-oss-20b, gpt-oss-120b): a mixture of experts with LLaMA's RMSNorms and
grouped-query attention, and touches of its own:

  * attention sinks: a learned logit per head joins each softmax as one more key, with no value, so a head
    may attend to nothing (ModelSpec.attention_sinks; sailor_ext/attention.py);
  * biases on q, k, v and the output projection (attention_bias), on the router, and on every expert's
    linears;
  * the experts' clamped GLU: gate' = min(gate, L), up' = clip(up, -L, L), out = gate' * sigmoid(a gate') *
    (up' + 1), with L = swiglu_limit and a = swiglu_alpha (ModelSpec.glu_limit, glu_alpha); the router
    takes the top k logits and softmaxes them (the renormalised probabilities);
  * blocks alternately windowed (128 tokens) and full (layer_types), YaRN positions (factor 32 over 4096).

Its checkpoints keep all experts in one tensor per block and projection, as x @ W: gate_up_proj
[E, h, 2 ffn] with gate and up columns alternating, down_proj [E, ffn, h], and their biases. The published
weights store the two expert projections in MXFP4 (quantization_config quant_method mxfp4:
`<name>_blocks` and `<name>_scales`); sailor_ext/hf.py dequantizes them on load, and export writes
unquantized weights. Refused: output_router_logits, as for every mixture of experts (moe.py).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ConfigReader, Family, WeightRule, llama, moe
from planner.specs.model import MAX_BLOCKS, ModelSpec

_LAYER = "model.layers.{i}."
# transformers' GptOssConfig: rope_parameters when a config gives none (rope_theta: the top-level one, HF_DEFAULTS')
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def from_hf(cfg, model_type: str) -> dict:
    quant = cfg.cfg.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") is None:
        raise SailorError(f"model config {cfg.source}: quantization_config names no quant_method; give gpt-oss's "
                          "own (mxfp4), or remove quantization_config for unquantized weights")
    if quant is not None and (not isinstance(quant, dict) or quant.get("quant_method") != "mxfp4"):
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise SailorError(f"model config {cfg.source}: quantization {short(method)} is not supported; give "
                          "unquantized weights or gpt-oss's own MXFP4 ones")
    moe.refuse_router_logits(cfg)
    fields = dict(cfg.cfg)
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)
    if fields.get("layer_types") is None:  # every second block full, the others windowed
        fields["layer_types"] = llama.every_nth_full(blocks, 2)
    if fields.get("rope_parameters") is None:  # (a non-empty rope_scaling still wins: llama._rope)
        fields["rope_parameters"] = dict(DEFAULT_ROPE)
    for key in ("rope_parameters", "rope_scaling"):
        value = fields.get(key)
        if isinstance(value, dict) and ({"full_attention", "sliding_attention"} & set(value) or
                                        "partial_rotary_factor" in value):
            raise SailorError(f"model config {cfg.source}: gpt_oss takes one {key} for every block, rotating whole "
                              "heads (no per-layer-type parameters, no partial_rotary_factor)")
    if cfg.has("partial_rotary_factor"):
        raise SailorError(f"model config {cfg.source}: gpt_oss rotates whole heads; remove partial_rotary_factor")
    spec = llama.from_hf(ConfigReader(fields, cfg.source), model_type)
    limits = {}
    for key, default in (("swiglu_limit", 7.0), ("swiglu_alpha", 1.702)):
        limits[key] = cfg.float(key, default)
        if limits[key] >= 1e30:
            raise SailorError(f"model config {cfg.source}: {key} {limits[key]:g} is beyond 1e30; check the value")
    # the expert count: num_local_experts, or its alias num_experts (transformers' attribute_map)
    experts = cfg.int("num_local_experts" if cfg.has("num_local_experts") else "num_experts", 128)
    spec.update(mlp_bias=True, out_bias=spec["qkv_bias"], activation="silu", attention_sinks=True, router_bias=True,
                experts=experts, experts_per_token=cfg.int("num_experts_per_tok", 4), expert_renorm=True,
                glu_limit=limits["swiglu_limit"], glu_alpha=limits["swiglu_alpha"])
    return spec


def to_hf(spec: ModelSpec) -> dict:
    if not (spec.attention_sinks and spec.router_bias and spec.mlp_bias and spec.glu_limit and spec.expert_renorm
            and spec.qkv_bias == spec.out_bias and spec.activation == "silu") or spec.qk_norm or \
            spec.shared_expert_ffn or spec.nope_blocks:
        raise SailorError(f"{spec.name} cannot be written as a gpt_oss config: gpt-oss has attention sinks, biases "
                          "on the router and the experts, the clamped GLU and renormalised expert weights, and no "
                          "q/k norms, shared expert or blocks without rotary positions")
    cfg = llama.to_hf(replace(spec, hf_model_type="llama", experts=0, experts_per_token=0, router_bias=False,
                              glu_limit=0.0, glu_alpha=1.0, attention_sinks=False))
    cfg.pop("mlp_bias")
    if not spec.windows:  # (transformers' default windows every second block)
        cfg["layer_types"] = ["full_attention"] * spec.num_blocks
    cfg.update(model_type="gpt_oss", num_local_experts=spec.experts, num_experts_per_tok=spec.experts_per_token,
               swiglu_limit=spec.glu_limit, swiglu_alpha=spec.glu_alpha, output_router_logits=False)
    return cfg


# LLaMA's attention tensors and norms, the sinks, the router with its bias, the experts' stacked tensors
WEIGHTS = replace(llama.WEIGHTS, block=(
    *(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp.")),
    WeightRule("self_attention.core_attention.sinks", (_LAYER + "self_attn.sinks",)),
    WeightRule("mlp.router.weight", (_LAYER + "mlp.router.weight",)),
    WeightRule("mlp.router.bias", (_LAYER + "mlp.router.bias",)),
    WeightRule("mlp.linear_fc1.weight", (_LAYER + "mlp.experts.gate_up_proj",), "experts_gate_up_alternating"),
    WeightRule("mlp.linear_fc1.bias", (_LAYER + "mlp.experts.gate_up_proj_bias",), "experts_gate_up_alternating"),
    WeightRule("mlp.linear_fc2.weight", (_LAYER + "mlp.experts.down_proj",), "experts_t"),
    WeightRule("mlp.linear_fc2.bias", (_LAYER + "mlp.experts.down_proj_bias",)),
))

FAMILY = Family("gpt_oss", ("gpt_oss",), from_hf, to_hf, WEIGHTS)
