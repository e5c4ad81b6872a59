"""DeepSeek-V3 (model_type deepseek_v3: DeepSeek-V3, DeepSeek-R1, Kimi K2, Moonlight) and DeepSeek-V2
(deepseek_v2: DeepSeek-V2, V2-Lite, V2.5, Coder-V2): multi-head latent attention and a mixture of experts with
dense first blocks.

  * Latent attention (ModelSpec.kv_lora_rank, q_lora_rank, rope_head_dim, v_head_dim; the runtime's
    sailor_ext/latent_attention.py): q from a latent q_lora_rank wide (null: from the hidden state), k and v
    from one latent kv_lora_rank wide, each q and k head qk_nope_head_dim + qk_rope_head_dim wide with a
    rotary key shared by all heads, values v_head_dim wide. rope_interleave (on by default) turns adjacent
    pairs. With a scaled rope whose parameters give mscale_all_dim, the softmax scale 1/sqrt(head width) is
    multiplied by (0.1 mscale_all_dim ln(factor) + 1)^2, as transformers does.
  * Experts: a sigmoid router whose scores plus a fixed bias per expert (e_score_correction_bias, a buffer
    in transformers, never trained) choose num_experts_per_tok of n_routed_experts, from the topk_group of
    n_group groups whose two best biased scores sum highest; the unbiased scores of the chosen, renormalised
    (norm_topk_prob) and times routed_scaling_factor, weigh them. n_shared_experts experts of
    moe_intermediate_size run for every token, as one shared MLP that wide, added without a gate.
  * The first first_k_dense_replace blocks have a dense MLP of intermediate_size (ModelSpec.dense_blocks).
  * DeepSeek-V2 differs: a softmax router without score biases whose chosen probabilities are not
    renormalised, times routed_scaling_factor; topk_method greedy (the top k of all experts) or
    group_limited_greedy (of the topk_group groups with the highest probability among n_group); its
    rotary positions always turn adjacent pairs; its experts' count may be named num_experts.

GLM-4.7-Flash (glm4_moe_lite) is V3 with its dense blocks named by mlp_layer_types (default: the first).
Mistral 4 (mistral4: Mistral Small 4) has V3's attention and blocks with a softmax router (one group), its chosen
probabilities renormalised (norm_topk_prob) and scaled, each block's experts in two tensors (gate_up_proj,
down_proj), and Ministral 3's query scale (rope_parameters' llama_4_scaling_beta; ModelSpec.query_scale_beta).
Youtu-LLM (youtu) has V3's attention and a dense MLP (intermediate_size) in every block, no experts.

DeepSeek-V3's balancing moves the score biases between steps (auxiliary-loss-free); transformers keeps them
fixed, and so do we unless the training argument --moe-router-bias-update-rate asks (sailor_ext/moe.py;
--moe-aux-loss-coeff is its complementary sequence-wise loss). The multi-token prediction
layers (num_nextn_predict_layers) are not trained, as transformers does not; their weights are left unread.
The published FP8 weights (quantization_config quant_method fp8: float8 tensors with a scale per block of
weight_block_size, `<name>_scale_inv`) are dequantized on load (sailor_ext/hf.py); export writes unquantized
weights. Refused: other quantizations, attention biases, V2's MLP biases (V3's MLPs have none: transformers
ignores mlp_bias there, and so do we), output_router_logits (as for every mixture of experts, moe.py),
DeepSeek-V2's topk_methods other than greedy and group_limited_greedy. GLM-4.5 (glm_moe.py) shares the experts.
"""
from __future__ import annotations

import math
from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ACTIVATION_TO_HF, ConfigReader, Family, WeightRule, llama, moe
from planner.specs.model import MAX_BLOCKS, ModelSpec

_LAYER = "model.layers.{i}."
# transformers' DeepseekV3Config and DeepseekV2Config defaults (5.24) for the fields read here (V2's n_group,
# topk_group and num_experts_per_tok have none)
V3_DEFAULTS = {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "num_attention_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
               "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6}
V2_DEFAULTS = {"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "moe_intermediate_size": 1407,
               "num_hidden_layers": 32, "num_attention_heads": 32, "n_shared_experts": 2, "n_routed_experts": 64,
               "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "qk_nope_head_dim": 128, "first_k_dense_replace": 0,
               "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
# transformers' Mistral4Config defaults (5.24; documented as Mistral-Small-4-119B-2603's); its rope parameters'
# (YaRN with the query scale) are in families.HF_DEFAULTS
MISTRAL4_DEFAULTS = {"vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288,
                     "moe_intermediate_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 32,
                     "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "kv_lora_rank": 256,
                     "q_lora_rank": 1024, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64,
                     "num_experts_per_tok": 4, "first_k_dense_replace": 0, "max_position_embeddings": 1048576,
                     "rms_norm_eps": 1e-6}
# transformers' Glm4MoeLiteConfig defaults (5.24); its dense blocks come from mlp_layer_types
LITE_DEFAULTS = {"vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536,
                 "num_hidden_layers": 47, "num_attention_heads": 20, "n_shared_experts": 1, "n_routed_experts": 64,
                 "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768, "qk_rope_head_dim": 64,
                 "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4,
                 "first_k_dense_replace": 0, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5}
# transformers' YoutuConfig defaults (5.24; documented as Youtu-LLM-2B's)
YOUTU_DEFAULTS = {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
                  "num_attention_heads": 16, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                  "v_head_dim": 128, "qk_nope_head_dim": 128, "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-6}
# transformers' MiniCPM3Config defaults (5.24; documented as MiniCPM3-4B's; v_head_dim: hidden / heads)
MINICPM3_DEFAULTS = {"vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 62,
                     "num_attention_heads": 40, "kv_lora_rank": 256, "q_lora_rank": 768, "qk_rope_head_dim": 32,
                     "v_head_dim": 64, "qk_nope_head_dim": 64, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5}
DEFAULTS = {"deepseek_v3": V3_DEFAULTS, "deepseek_v2": V2_DEFAULTS, "mistral4": MISTRAL4_DEFAULTS,
            "glm4_moe_lite": LITE_DEFAULTS, "youtu": YOUTU_DEFAULTS, "minicpm3": MINICPM3_DEFAULTS}
DENSE = ("youtu", "minicpm3")  # latent attention with a dense MLP in every block
MLP_TYPES = ("dense", "sparse")
V2_TOPK = ("greedy", "group_limited_greedy")  # the topk_method values DeepSeek-V2's router runs


def _count(cfg, key: str, default: int) -> int:
    """A field that may be 0 (first_k_dense_replace, n_shared_experts)."""
    value = cfg.cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or \
            not 0 <= value <= 1 << 30:
        raise SailorError(f"model config {cfg.source}: {key} must be a whole number >= 0, not {short(value)}")
    return int(value)


def _softmax_scale(cfg, head_width: int) -> float:
    """transformers' scale when its rope parameters give mscale_all_dim (any scaled rope), else 0 (1/sqrt(d))."""
    params = cfg.cfg.get("rope_scaling") or cfg.cfg.get("rope_parameters") or {}  # (llama._rope's precedence)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default" or not params.get("mscale_all_dim"):
        return 0.0
    factor = cfg.number("rope factor", params.get("factor"))
    m = 1.0 if factor <= 1 else 0.1 * cfg.number("rope mscale_all_dim", params["mscale_all_dim"]) * \
        math.log(factor) + 1.0
    return head_width ** -0.5 * m * m


def refuse_quantization(cfg) -> None:
    """Quantized checkpoints other than DeepSeek's block-scaled FP8 (which sailor_ext/hf.py dequantizes)."""
    quant = cfg.cfg.get("quantization_config")
    if quant is not None and (not isinstance(quant, dict) or quant.get("quant_method") != "fp8"):
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise SailorError(f"model config {cfg.source}: quantization {short(method)} is not supported; give "
                          "unquantized weights or DeepSeek's own block-scaled FP8 ones (quant_method fp8)")


def sigmoid_experts(cfg, defaults: dict, blocks: int, alias: str = "num_local_experts") -> dict:
    """DeepSeek-V3's mixture of experts as a config gives it (GLM-4.5's too): the sigmoid router with score
    biases and groups, the shared experts, the dense first blocks (ModelSpec fields). alias: another name of
    n_routed_experts (transformers' attribute_map)."""
    fields = _experts(cfg, defaults, blocks, alias)
    fields.update(router_sigmoid=True, expert_score_bias=True, expert_renorm=cfg.bool("norm_topk_prob", True),
                  expert_groups=cfg.int("n_group", defaults["n_group"]),
                  expert_groups_per_token=cfg.int("topk_group", defaults["topk_group"]))
    return fields


def _experts(cfg, defaults: dict, blocks: int, alias: str) -> dict:
    """The experts' fields V2 and V3 read alike."""
    width = cfg.int("moe_intermediate_size", defaults["moe_intermediate_size"])
    experts = cfg.int("n_routed_experts" if cfg.has("n_routed_experts") or not cfg.has(alias) else alias,
                      defaults["n_routed_experts"])
    dense = min(_count(cfg, "first_k_dense_replace", defaults["first_k_dense_replace"]), blocks)
    return dict(ffn_hidden=width, experts=experts, router_fp32=True,  # (as transformers keeps it)
                experts_per_token=cfg.int("num_experts_per_tok", defaults.get("num_experts_per_tok")),
                shared_expert_ffn=width * _count(cfg, "n_shared_experts", defaults["n_shared_experts"]),
                shared_expert_gated=False,
                routed_scale=cfg.float("routed_scaling_factor", defaults["routed_scaling_factor"]),
                dense_blocks=tuple(range(dense)),
                dense_ffn=cfg.int("intermediate_size", defaults["intermediate_size"]) if dense else 0)


def mlp_types(cfg, blocks: int) -> dict:
    """GLM-4.7-Flash's dense blocks: those mlp_layer_types names dense (default: the first)."""
    types = cfg.cfg.get("mlp_layer_types")
    if types is None:
        types = ["dense"] + ["sparse"] * (blocks - 1)
    if not isinstance(types, list) or len(types) != blocks or any(t not in MLP_TYPES for t in types):
        raise SailorError(f"model config {cfg.source}: mlp_layer_types must list dense or sparse for each of the "
                          f"{blocks} layers, not {short(types)}")
    dense = tuple(i for i, t in enumerate(types) if t == "dense")
    return {"dense_blocks": dense, "dense_ffn": cfg.int("intermediate_size", LITE_DEFAULTS["intermediate_size"])
            if dense else 0}


def from_hf(cfg, model_type: str) -> dict:
    v3, defaults = model_type in ("deepseek_v3", "glm4_moe_lite", *DENSE), DEFAULTS[model_type]
    if model_type == "minicpm3" and cfg.cfg.get("v_head_dim") is None:  # (transformers: hidden / heads)
        cfg = ConfigReader({**cfg.cfg, "v_head_dim": cfg.int("hidden_size", defaults["hidden_size"]) //
                            cfg.int("num_attention_heads", defaults["num_attention_heads"])}, cfg.source)
    refuse_quantization(cfg)
    moe.refuse_router_logits(cfg)
    for key in ("attention_bias", "mlp_bias") if not v3 else ("attention_bias",):  # (V3's MLPs never have biases)
        if cfg.bool(key, False):
            raise SailorError(f"model config {cfg.source}: {key} is not supported for {model_type}; set it to false")
    d = {key: cfg.int(key, defaults.get(key)) for key in (
        "vocab_size", "hidden_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
        "qk_nope_head_dim", "max_position_embeddings")}
    blocks = cfg.int("num_hidden_layers", defaults["num_hidden_layers"], hi=MAX_BLOCKS)
    q_rank = 0 if "q_lora_rank" in cfg.cfg and cfg.cfg["q_lora_rank"] is None else \
        cfg.int("q_lora_rank", defaults["q_lora_rank"])
    if model_type in DENSE:  # (a dense MLP in every block)
        experts = {"ffn_hidden": cfg.int("intermediate_size", defaults["intermediate_size"])}
    elif v3:
        experts = sigmoid_experts(cfg, defaults, blocks)
        if model_type == "glm4_moe_lite":
            experts.update(mlp_types(cfg, blocks))
    elif model_type == "mistral4":  # a softmax router, its chosen probabilities renormalised (norm_topk_prob)
        if cfg.int("n_group", 1) > 1:
            raise SailorError(f"model config {cfg.source}: mistral4's expert groups (n_group > 1, scored by their "
                              "two best probabilities) are not supported; use n_group 1")
        experts = {**_experts(cfg, defaults, blocks, "num_local_experts"),
                   "expert_renorm": cfg.bool("norm_topk_prob", True), "router_fp32": False}
    else:
        method = cfg.str("topk_method", "greedy")
        if method not in V2_TOPK:
            raise SailorError(f"model config {cfg.source}: topk_method {short(method)} is not one deepseek_v2's "
                              f"router runs; use {' or '.join(V2_TOPK)}")
        groups = (cfg.int("n_group"), cfg.int("topk_group")) if method == "group_limited_greedy" else (1, 1)
        experts = {**_experts(cfg, defaults, blocks, "num_experts"), "expert_renorm": False,
                   "expert_groups": groups[0], "expert_groups_per_token": groups[1]}
    theta, scaling = llama._rope(cfg)
    head = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    heads = d["num_attention_heads"]
    return dict(
        hidden=d["hidden_size"], num_blocks=blocks, heads=heads, vocab=d["vocab_size"],
        max_positions=d["max_position_embeddings"], tied_embeddings=cfg.bool("tie_word_embeddings", False),
        gated_mlp=True, rms_norm=True, learned_positions=False, qkv_bias=False, out_bias=False, mlp_bias=False,
        separate_final_norm=True, head_dim_override=head if head * heads != d["hidden_size"] else 0,
        activation=cfg.activation("hidden_act", "silu"), norm_eps=cfg.float("rms_norm_eps", defaults["rms_norm_eps"]),
        rope_theta=theta, rope_scaling=scaling, pad_token=cfg.pad_token(None),
        rotary_interleaved={"deepseek_v2": True, "minicpm3": False}.get(model_type,
                                                                        cfg.bool("rope_interleave", True)),
        attention_scale=_softmax_scale(cfg, head), **(llama._query_scale(cfg) if model_type == "mistral4" else {}),
        kv_lora_rank=d["kv_lora_rank"], q_lora_rank=q_rank, rope_head_dim=d["qk_rope_head_dim"],
        v_head_dim=d["v_head_dim"], **experts,
        **(_minicpm3(cfg, d["hidden_size"], blocks) if model_type == "minicpm3" else {}),
    )


def _minicpm3(cfg, hidden: int, blocks: int) -> dict:
    """MiniCPM3's multipliers: the embeddings times scale_emb, each residual branch times scale_depth / sqrt(blocks),
    the hidden states before the head divided by hidden / dim_model_base (ModelSpec.logits_divisor); null: 1."""
    depth = cfg.cfg.get("scale_depth", 1.4)
    base = cfg.cfg.get("dim_model_base", 256)
    return dict(embedding_multiplier=cfg.float("scale_emb", 12.0),
                residual_multiplier=1.0 if depth is None else cfg.number("scale_depth", depth) / math.sqrt(blocks),
                logits_divisor=1.0 if base is None else hidden / cfg.number("dim_model_base", base))


def to_hf(spec: ModelSpec) -> dict:
    model_type = spec.hf_model_type or ("deepseek_v3" if spec.router_sigmoid else "deepseek_v2")
    v3, mistral4 = model_type in ("deepseek_v3", "glm4_moe_lite"), model_type == "mistral4"
    lite, youtu, minicpm3 = model_type == "glm4_moe_lite", model_type in DENSE, model_type == "minicpm3"
    if youtu and (not spec.latent or spec.experts or spec.qk_norm or spec.nope_blocks or spec.query_scale_span or
                  minicpm3 == spec.rotary_interleaved or not minicpm3 and (
                      spec.embedding_multiplier, spec.residual_multiplier, spec.logits_divisor) != (1, 1, 1)):
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: {model_type} has latent attention "
                          "and a dense MLP in every block (minicpm3 its multipliers and halves rotated)")
    if not youtu and (not spec.latent or (spec.router_sigmoid, spec.expert_score_bias) != (v3, v3) or
                      (model_type == "deepseek_v2" and (spec.expert_renorm or not spec.rotary_interleaved)) or
                      spec.qk_norm or spec.nope_blocks or bool(spec.query_scale_span) != mistral4 or
                      (mistral4 and spec.expert_groups > 1)):
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: it has latent attention and a "
                          "sigmoid router with score biases (deepseek_v3) or a softmax router with unrenormalised "
                          "weights and adjacent pairs rotated (deepseek_v2), or with renormalised weights, one "
                          "group and a query scale (mistral4)")
    scale = spec.attention_scale or spec.head_dim ** -0.5
    rope = llama.hf_rope(spec)
    if abs(scale * spec.head_dim ** 0.5 - 1) > 1e-12:  # the softmax scale is (mscale_all_dim's factor)^2
        if rope.get("factor", 1) <= 1:
            raise SailorError(f"{spec.name}: {model_type}'s config scales attention only by a scaled rope's "
                              "mscale_all_dim, and the model has no scaled rope")
        rope["mscale_all_dim"] = (math.sqrt(scale * spec.head_dim ** 0.5) - 1) / (0.1 * math.log(rope["factor"]))
    cfg = {
        "model_type": model_type, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.heads, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "rms_norm_eps": spec.norm_eps,
        "hidden_act": ACTIVATION_TO_HF[spec.activation], "rope_parameters": rope,
        "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None, "attention_bias": False,
        "q_lora_rank": spec.q_lora_rank or None, "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.rope_head_dim, "qk_nope_head_dim": spec.head_dim - spec.rope_head_dim,
        "v_head_dim": spec.v_head_dim,
    }
    if minicpm3:
        base = spec.hidden / spec.logits_divisor
        if abs(base - round(base)) > 1e-6:
            raise SailorError(f"{spec.name} cannot be written as a minicpm3 config: its logits divisor "
                              f"{spec.logits_divisor:g} is not hidden_size over a whole dim_model_base")
        return {**cfg, "intermediate_size": spec.ffn_hidden, "scale_emb": spec.embedding_multiplier,
                "scale_depth": spec.residual_multiplier * math.sqrt(spec.num_blocks), "dim_model_base": round(base)}
    if youtu:
        return {**cfg, "intermediate_size": spec.ffn_hidden, "rope_interleave": spec.rotary_interleaved}
    cfg.update(experts_to_hf(replace(spec, dense_blocks=(), dense_ffn=0) if lite else spec, model_type))
    if lite:
        cfg.update(mlp_layer_types=["dense" if i in spec.dense_blocks else "sparse" for i in range(spec.num_blocks)],
                   intermediate_size=spec.dense_ffn or spec.ffn_hidden)
        del cfg["first_k_dense_replace"], cfg["num_nextn_predict_layers"]
    if mistral4:
        rope.update(llama_4_scaling_beta=spec.query_scale_beta, original_max_position_embeddings=spec.query_scale_span)
        cfg.update(rope_interleave=spec.rotary_interleaved, norm_topk_prob=spec.expert_renorm)
    elif v3:
        cfg.update(rope_interleave=spec.rotary_interleaved)
    else:
        cfg.update(mlp_bias=False, topk_method="group_limited_greedy" if spec.expert_groups > 1 else "greedy")
    return cfg


def experts_to_hf(spec: ModelSpec, model_type: str) -> dict:
    """The config fields of DeepSeek's experts (V3's and GLM-4.5's, V2's without norm_topk_prob)."""
    if spec.shared_expert_gated and spec.shared_expert_ffn or spec.shared_expert_ffn % spec.ffn_hidden or \
            spec.glu_limit or spec.router_bias or spec.dense_blocks != tuple(range(len(spec.dense_blocks))):
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: its shared experts "
                          "must be ungated and as wide as a multiple of a routed one, and its dense blocks first")
    cfg = {"moe_intermediate_size": spec.ffn_hidden, "intermediate_size": spec.dense_ffn or spec.ffn_hidden,
           "n_routed_experts": spec.experts, "num_experts_per_tok": spec.experts_per_token,
           "n_shared_experts": spec.shared_expert_ffn // spec.ffn_hidden, "n_group": spec.expert_groups,
           "topk_group": spec.expert_groups_per_token, "routed_scaling_factor": spec.routed_scale,
           "first_k_dense_replace": len(spec.dense_blocks), "output_router_logits": False}
    if spec.router_sigmoid:
        cfg.update(norm_topk_prob=spec.expert_renorm, num_nextn_predict_layers=0)
    return cfg


_ATTENTION = {"linear_q_down_proj": "q_a_proj", "q_latent_layernorm": "q_a_layernorm", "linear_q_up_proj": "q_b_proj",
              "linear_q_proj": "q_proj", "linear_kv_down_proj": "kv_a_proj_with_mqa",
              "kv_latent_layernorm": "kv_a_layernorm", "linear_kv_up_proj": "kv_b_proj", "linear_proj": "o_proj"}
_MLP, _EXPERT, _SHARED = _LAYER + "mlp.", _LAYER + "mlp.experts.{e}.", _LAYER + "mlp.shared_experts."
# a dense MLP in the dense blocks; in the others the router with its score bias, the routed experts (one tensor
# each) and the shared experts
EXPERT_RULES = (
    WeightRule("mlp.linear_fc1.weight", (_MLP + "gate_proj.weight", _MLP + "up_proj.weight"), "gate_up", "dense"),
    WeightRule("mlp.linear_fc2.weight", (_MLP + "down_proj.weight",), blocks="dense"),
    WeightRule("mlp.router.weight", (_MLP + "gate.weight",), blocks="sparse"),
    WeightRule("mlp.router.score_bias", (_MLP + "gate.e_score_correction_bias",), blocks="sparse"),
    WeightRule("mlp.linear_fc1.weight", (_EXPERT + "gate_proj.weight", _EXPERT + "up_proj.weight"), "experts_gate_up",
               "sparse"),
    WeightRule("mlp.linear_fc2.weight", (_EXPERT + "down_proj.weight",), "experts", "sparse"),
    WeightRule("mlp.shared_expert.linear_fc1.weight", (_SHARED + "gate_proj.weight", _SHARED + "up_proj.weight"),
               "gate_up", "sparse"),
    WeightRule("mlp.shared_expert.linear_fc2.weight", (_SHARED + "down_proj.weight",), blocks="sparse"),
)
# LLaMA's norms, embedding and head; the latent attention's tensors; the experts'
WEIGHTS = replace(llama.WEIGHTS, block=(
    WeightRule("input_layernorm.weight", (_LAYER + "input_layernorm.weight",)),
    *(WeightRule(f"self_attention.{ours}.weight", (f"{_LAYER}self_attn.{theirs}.weight",))
      for ours, theirs in _ATTENTION.items()),
    WeightRule("pre_mlp_layernorm.weight", (_LAYER + "post_attention_layernorm.weight",)), *EXPERT_RULES))

FAMILY = Family("deepseek", ("deepseek_v2", "deepseek_v3", "glm4_moe_lite"), from_hf, to_hf, WEIGHTS)
# Youtu-LLM and MiniCPM3: the latent attention's tensors and LLaMA's MLP in every block
YOUTU = Family("youtu", ("youtu", "minicpm3"), from_hf, to_hf, replace(WEIGHTS, block=(
    *(r for r in WEIGHTS.block if not r.ours.startswith("mlp.")),
    *(r for r in llama.WEIGHTS.block if r.ours.startswith("mlp.")))))
# Mistral 4: DeepSeek's tensors with each block's experts in two, as transformers 5 keeps them: gate_up_proj
# [E, 2 ffn, h] (the gate's rows, then up's) and down_proj [E, h, ffn]; no score bias
MISTRAL4 = Family("mistral4", ("mistral4",), from_hf, to_hf, replace(WEIGHTS, block=tuple(
    r for r in WEIGHTS.block if r.blocks != "sparse" or r.ours.startswith("mlp.shared_expert.")
    or r.ours == "mlp.router.weight") + (
    WeightRule("mlp.linear_fc1.weight", (_MLP + "experts.gate_up_proj",), "experts_gate_up_cat", "sparse"),
    WeightRule("mlp.linear_fc2.weight", (_MLP + "experts.down_proj",), blocks="sparse"))))
