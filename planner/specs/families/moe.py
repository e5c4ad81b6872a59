"""Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, ERNIE-4.5-MoE, MiniMax-M2 and GraniteMoE: LLaMA's, Qwen2's, Qwen3's,
OLMo 2's, ERNIE 4.5's and Granite's attention, a mixture of experts in place of the MLP.

Every block's MLP is `experts` SwiGLU MLPs and a router (ModelSpec.experts; the runtime's
sailor_ext/moe.py). Mixtral (num_local_experts, intermediate_size per expert) renormalises the
chosen experts' probabilities; Qwen2/3-MoE (num_experts, moe_intermediate_size) and OLMoE
(num_experts, intermediate_size) do where norm_topk_prob says so. Qwen2-MoE adds a shared expert
(shared_expert_intermediate_size) gated by a sigmoid, and its q/k/v biases are `qkv_bias`. OLMoE
normalises q and k across all heads, as OLMo 2 (olmo.py), with LLaMA's pre-norms. Checkpoints keep one tensor
per expert (`experts.{e}.w1`, or `gate_proj`), as the published ones and transformers' save_pretrained do.
ERNIE-4.5-MoE (ernie4_5_moe) has ERNIE 4.5's attention (llama.py), experts from moe_layer_start_index to
moe_layer_end_index every moe_layer_interval-th block (dense MLPs intermediate_size wide between), chosen by
their softmax probabilities plus a fixed bias each (moe_statics), weighed by the probabilities renormalised, and
moe_num_shared_experts ungated shared experts. MiniMax-M2 (minimax_m2) normalises q and k across all heads as
OLMoE, rotates a share of each head (rotary_dim), and routes as DeepSeek-V3 (a sigmoid router whose scores plus
a fixed bias per expert choose, renormalised; deepseek.py) with Mixtral's names. GraniteMoE (num_local_experts,
intermediate_size) is Granite's block (its multipliers, llama.py) with experts that renormalise, kept as one
tensor per block and projection (input_linear [E, 2 ffn, h] holding [gate; up], output_linear [E, h, ffn]);
GraniteMoeShared adds a shared expert (shared_intermediate_size) without a gate. FlexOlmo (flex_olmo) is OLMo 2's
block (norms after the sublayers, q/k norms across all heads: olmo.py) with OLMoE's experts.

Refused, each with the field that asks for it: transformers' load-balancing loss (output_router_logits),
pooled over all blocks and the whole batch, which a pipeline of microbatches cannot compute (the
runtime's --moe-aux-loss-coeff balances per block and sequence instead, sailor_ext/moe.py); router
jitter; Qwen3-MoE's dense blocks among the sparse ones (mlp_only_layers, decoder_sparse_step); OLMoE's
clipped q, k and v (clip_qkv).
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import SailorError
from planner.specs.families import ConfigReader, Family, WeightMap, WeightRule, llama, olmo, phi3
from planner.specs.model import ModelSpec

_LAYER = "model.layers.{i}."
QWEN_DEFAULTS = {"qwen2_moe": (60, 4, 1408), "qwen3_moe": (128, 8, 768)}  # experts, per token, width (transformers')
GRANITE = ("granitemoe", "granitemoeshared")


def refuse_router_logits(cfg) -> None:
    """transformers' load-balancing loss (output_router_logits) is refused, and the runtime's named instead."""
    if cfg.bool("output_router_logits", False):
        coeff = cfg.cfg.get("router_aux_loss_coef")
        coeff = f"{float(coeff):g}" if isinstance(coeff, (int, float)) and not isinstance(coeff, bool) and \
            0 < coeff <= 1e3 else "C"  # (the flag's range)
        raise SailorError(f"model config {cfg.source}: output_router_logits adds a load-balancing loss pooled over all "
                          "blocks and the whole batch, which no pipeline of microbatches computes; set it to false "
                          f"and balance per sequence with the training argument --moe-aux-loss-coeff {coeff}")


def from_hf(cfg, model_type: str) -> dict:
    refuse_router_logits(cfg)
    if model_type == "ernie4_5_moe":  # ERNIE 4.5's attention, its heads hidden / heads wide unless set
        cfg = ConfigReader({"head_dim": cfg.int("hidden_size") // cfg.int("num_attention_heads"), **cfg.cfg},
                           cfg.source)
    # (Granite's multipliers; ERNIE 4.5's attention)
    fields = llama.from_hf(cfg, "granite" if model_type in GRANITE else "ernie4_5" if model_type == "ernie4_5_moe"
                           else model_type)
    if fields["mlp_bias"]:  # (ERNIE 4.5's use_bias puts biases on every linear)
        field = "use_bias" if model_type == "ernie4_5_moe" else "mlp_bias"
        raise SailorError(f"model config {cfg.source}: {model_type}'s experts' linears have no biases; set {field} "
                          "to false")
    # the expert count: num_local_experts, or its alias num_experts (Qwen3-MoE's published configs; not GraniteMoE's)
    key = "num_local_experts" if cfg.has("num_local_experts") or model_type in GRANITE else "num_experts"
    if model_type == "mixtral":
        if cfg.cfg.get("router_jitter_noise") not in (None, 0, 0.0):
            raise SailorError(f"model config {cfg.source}: router_jitter_noise is not supported; set it to 0")
        experts, renorm, top_k = cfg.int(key, 8), True, cfg.int("num_experts_per_tok", 2)
    elif model_type in GRANITE:
        experts, renorm, top_k = cfg.int(key, 8), True, cfg.int("num_experts_per_tok", 2)
        if model_type == "granitemoeshared" and cfg.cfg.get("shared_intermediate_size") not in (None, 0):  # 0: none
            fields.update(shared_expert_ffn=cfg.int("shared_intermediate_size", 0), shared_expert_gated=False)
    elif model_type == "ernie4_5_moe":
        blocks = fields["num_blocks"]
        start, end, step = (cfg.cfg.get(k, d) for k, d in (("moe_layer_start_index", 1), ("moe_layer_end_index", -1),
                                                             ("moe_layer_interval", 1)))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)) or step < 1:
            raise SailorError(f"model config {cfg.source}: moe_layer_start_index, moe_layer_end_index and "
                              "moe_layer_interval must be whole numbers (the interval at least 1)")
        end = blocks - 1 if end == -1 else end
        dense = tuple(i for i in range(blocks) if (i + 1) % step or not start <= i <= end)
        width = cfg.int("moe_intermediate_size", 1536)
        shared = 0 if cfg.cfg.get("moe_num_shared_experts", 2) in (None, 0) else cfg.int("moe_num_shared_experts", 2)
        experts, renorm, top_k = cfg.int("moe_num_experts", 64), True, cfg.int("moe_k", 6)
        fields.update(ffn_hidden=width, expert_score_bias=True, shared_expert_ffn=width * shared, router_fp32=True,
                      shared_expert_gated=False,
                      **({"dense_blocks": dense, "dense_ffn": cfg.int("intermediate_size")} if dense else {}))
    elif model_type == "minimax_m2":  # (its released configs give the rotated share as rotary_dim)
        if cfg.cfg.get("router_jitter_noise") not in (None, 0, 0.0):
            raise SailorError(f"model config {cfg.source}: router_jitter_noise is not supported; set it to 0")
        experts, renorm, top_k = cfg.int(key, 256), True, cfg.int("num_experts_per_tok", 8)
        head_dim = fields["head_dim_override"] or fields["hidden"] // fields["heads"]
        fraction = cfg.int("rotary_dim") / head_dim if cfg.has("rotary_dim") else phi3.rotary_fraction(cfg)
        fields.update(qk_norm=True, qk_norm_full=True, router_sigmoid=True, expert_score_bias=True,
                      rotary_fraction=fraction)
    elif model_type == "olmoe":
        if cfg.has("clip_qkv"):
            raise SailorError(f"model config {cfg.source}: clip_qkv is not supported; set it to null")
        experts, renorm, top_k = cfg.int(key, 64), cfg.bool("norm_topk_prob", False), cfg.int("num_experts_per_tok", 8)
        fields.update(qk_norm=True, qk_norm_full=True, pad_token=cfg.pad_token(olmo.PAD_TOKEN))
    else:  # Qwen2-MoE and Qwen3-MoE
        if cfg.cfg.get("mlp_only_layers") not in (None, []) or cfg.int("decoder_sparse_step", 1) != 1:
            raise SailorError(f"model config {cfg.source}: dense blocks among the experts' (mlp_only_layers, "
                              "decoder_sparse_step) are not supported; every block must have experts")
        count, top, width = QWEN_DEFAULTS[model_type]
        experts, renorm, top_k = cfg.int(key, count), cfg.bool("norm_topk_prob", False), cfg.int("num_experts_per_tok",
                                                                                                  top)
        fields["ffn_hidden"] = cfg.int("moe_intermediate_size", width)
        if model_type == "qwen2_moe":
            fields.update(shared_expert_ffn=cfg.int("shared_expert_intermediate_size", 5632),
                          qkv_bias=cfg.bool("qkv_bias", True), out_bias=False)
    fields.update(experts=experts, experts_per_token=top_k, expert_renorm=renorm)
    return fields


def to_hf(spec: ModelSpec) -> dict:
    model_type = spec.hf_model_type or "mixtral"
    if spec.windows and len(set(spec.windows)) > 1:
        raise SailorError(f"{spec.name}: {model_type}'s config windows every block or none, not some of them")
    minimax = model_type == "minimax_m2"
    if spec.router_sigmoid != minimax or spec.qk_norm_full != (model_type in ("olmoe", "minimax_m2")) or \
            spec.expert_groups > 1 or spec.routed_scale != 1 or (spec.rotary_fraction < 1) > minimax:
        raise SailorError(f"{spec.name}: {model_type}'s config cannot express its router, q/k norms or rotary share "
                          "(a sigmoid router with score biases and a rotated share of each head are minimax_m2's, q "
                          "and k normalised across all heads minimax_m2's and olmoe's)")
    if model_type == "mixtral" and (spec.qk_norm or spec.qkv_bias or not spec.expert_renorm):
        raise SailorError(f"{spec.name}: mixtral's config cannot express q/k norms, q/k/v biases or unrenormalised "
                          "expert weights")
    ernie = model_type == "ernie4_5_moe"
    if spec.expert_score_bias != (model_type in ("minimax_m2", "ernie4_5_moe")) or \
            bool(spec.dense_blocks) > ernie or (ernie and spec.shared_expert_ffn % spec.ffn_hidden):
        raise SailorError(f"{spec.name}: {model_type}'s config cannot express its experts' score biases, dense "
                          "blocks or shared experts")
    if spec.shared_expert_ffn and {"qwen2_moe": True, "granitemoeshared": False, "ernie4_5_moe": False}.get(
            model_type) != spec.shared_expert_gated:
        raise SailorError(f"{spec.name}: {model_type}'s config cannot express its shared expert (qwen2_moe's is "
                          "gated, granitemoeshared's is not, the others have none)")
    if model_type in GRANITE and not spec.expert_renorm:
        raise SailorError(f"{spec.name}: {model_type}'s config cannot express unrenormalised expert weights")
    # the attention's fields as the dense model of the same attention writes them (OLMoE's q/k norms: its own)
    base = {"qwen3_moe": "qwen3", "qwen2_moe": "qwen2", "olmoe": "llama", "granitemoe": "granite",
            "granitemoeshared": "granite", "minimax_m2": "llama", "ernie4_5_moe": "ernie4_5"}.get(model_type, "mistral")
    cfg = llama.to_hf(replace(spec, experts=0, experts_per_token=0, shared_expert_ffn=0, shared_expert_gated=True,
                              qk_norm=spec.qk_norm and base == "qwen3", router_sigmoid=False, expert_score_bias=False,
                              qk_norm_full=False, dense_blocks=(), dense_ffn=0, hf_model_type=base))
    cfg.update(model_type=model_type, num_experts_per_tok=spec.experts_per_token, output_router_logits=False)
    if model_type in ("mixtral", "minimax_m2"):
        cfg.update(num_local_experts=spec.experts, router_jitter_noise=0.0)
    if ernie:  # (every block from the first on has experts unless dense_blocks says otherwise: the interval 1, the
        # start and end the first and last sparse blocks, which must bound a run of them)
        sparse = [i for i in range(spec.num_blocks) if i not in spec.dense_blocks]
        if sparse != list(range(sparse[0], sparse[-1] + 1)):
            raise SailorError(f"{spec.name}: ernie4_5_moe's config puts experts on one run of blocks, not on "
                              f"{sparse}")
        cfg.update(moe_num_experts=spec.experts, moe_k=spec.experts_per_token, moe_intermediate_size=spec.ffn_hidden,
                   moe_num_shared_experts=spec.shared_expert_ffn // spec.ffn_hidden, moe_layer_start_index=sparse[0],
                   moe_layer_end_index=sparse[-1], moe_layer_interval=1,
                   intermediate_size=spec.dense_ffn or spec.ffn_hidden)
        return cfg
    if model_type == "minimax_m2":
        for key in ("attention_bias", "mlp_bias"):
            cfg.pop(key)
        cfg["rope_parameters"]["partial_rotary_factor"] = spec.rotary_fraction
    elif model_type in GRANITE:
        cfg.pop("mlp_bias")
        cfg.update(num_local_experts=spec.experts)
    else:
        cfg.update(num_experts=spec.experts, norm_topk_prob=spec.expert_renorm)
    if model_type in QWEN_DEFAULTS:
        cfg.update(moe_intermediate_size=spec.ffn_hidden, decoder_sparse_step=1, mlp_only_layers=[])
    if model_type == "qwen2_moe":
        cfg.update(shared_expert_intermediate_size=spec.shared_expert_ffn, qkv_bias=spec.qkv_bias)
    if model_type == "olmoe":
        cfg.update(clip_qkv=None)
    if model_type == "granitemoeshared":
        cfg.update(shared_intermediate_size=spec.shared_expert_ffn)
    return cfg


def _weights(router: str, experts: str, gate: str, up: str, down: str) -> WeightMap:
    """llama.WEIGHTS with the MLP's rules replaced by the router's and the experts' ({e}: expert index)."""
    block = tuple(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp."))
    moe = (WeightRule("mlp.router.weight", (_LAYER + router,)),
           WeightRule("mlp.linear_fc1.weight", (_LAYER + experts + gate, _LAYER + experts + up), "experts_gate_up"),
           WeightRule("mlp.linear_fc2.weight", (_LAYER + experts + down,), "experts"))
    return replace(llama.WEIGHTS, block=block + moe)


MIXTRAL = Family("mixtral", ("mixtral",), from_hf, to_hf,
                 _weights("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.", "w1.weight", "w3.weight",
                          "w2.weight"))
QWEN3_MOE = Family("qwen3_moe", ("qwen3_moe",), from_hf, to_hf,
                   _weights("mlp.gate.weight", "mlp.experts.{e}.", "gate_proj.weight", "up_proj.weight",
                            "down_proj.weight"))
OLMOE = Family("olmoe", ("olmoe",), from_hf, to_hf, QWEN3_MOE.weights)  # the same tensor names
QWEN2_MOE = Family("qwen2_moe", ("qwen2_moe",), from_hf, to_hf, replace(QWEN3_MOE.weights, block=(
    *QWEN3_MOE.weights.block,
    WeightRule("mlp.shared_expert.linear_fc1.weight", (_LAYER + "mlp.shared_expert.gate_proj.weight",
                                                       _LAYER + "mlp.shared_expert.up_proj.weight"), "gate_up"),
    WeightRule("mlp.shared_expert.linear_fc2.weight", (_LAYER + "mlp.shared_expert.down_proj.weight",)),
    WeightRule("mlp.shared_gate.weight", (_LAYER + "mlp.shared_expert_gate.weight",)))))
_MLP = _LAYER + "mlp."
ERNIE_MOE = Family("ernie4_5_moe", ("ernie4_5_moe",), from_hf, to_hf, replace(llama.WEIGHTS, block=(
    *(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp.")),
    *(replace(r, blocks="dense") for r in llama.WEIGHTS.block if r.ours.startswith("mlp.")),
    *(replace(r, blocks="sparse") for r in QWEN3_MOE.weights.block if r.ours.startswith("mlp.")),
    WeightRule("mlp.router.score_bias", (_MLP + "moe_statics.e_score_correction_bias",), "row", "sparse"),
    WeightRule("mlp.shared_expert.linear_fc1.weight", (_MLP + "shared_experts.gate_proj.weight",
                                                       _MLP + "shared_experts.up_proj.weight"), "gate_up", "sparse"),
    WeightRule("mlp.shared_expert.linear_fc2.weight", (_MLP + "shared_experts.down_proj.weight",), blocks="sparse"))))
MINIMAX_M2 = Family("minimax_m2", ("minimax_m2",), from_hf, to_hf, replace(MIXTRAL.weights, block=(
    *MIXTRAL.weights.block,
    WeightRule("mlp.router.score_bias", (_LAYER + "block_sparse_moe.e_score_correction_bias",)))))
GRANITE_MOE = Family("granitemoe", GRANITE, from_hf, to_hf, replace(llama.WEIGHTS, block=(
    *(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp.")),
    WeightRule("mlp.router.weight", (_LAYER + "block_sparse_moe.router.layer.weight",)),
    WeightRule("mlp.linear_fc1.weight", (_LAYER + "block_sparse_moe.input_linear.weight",), "experts_gate_up_cat"),
    WeightRule("mlp.linear_fc2.weight", (_LAYER + "block_sparse_moe.output_linear.weight",)),
    WeightRule("mlp.shared_expert.linear_fc1.weight", (_LAYER + "shared_mlp.input_linear.weight",), "gate_up_cat"),
    WeightRule("mlp.shared_expert.linear_fc2.weight", (_LAYER + "shared_mlp.output_linear.weight",)))))


def flex_olmo_from_hf(cfg, model_type: str) -> dict:
    refuse_router_logits(cfg)
    return {**olmo.from_hf(cfg, model_type), "experts": cfg.int("num_experts", 7),
            "experts_per_token": cfg.int("num_experts_per_tok", 5), "expert_renorm": cfg.bool("norm_topk_prob", False)}


def flex_olmo_to_hf(spec: ModelSpec) -> dict:
    if not spec.experts or spec.shared_expert_ffn or spec.router_sigmoid or spec.expert_score_bias or \
            spec.dense_blocks or spec.routed_scale != 1 or spec.expert_groups > 1:
        raise SailorError(f"{spec.name} cannot be written as a flex_olmo config: its experts differ from flex_olmo's")
    cfg = olmo.to_hf(replace(spec, hf_model_type="olmo2", experts=0, experts_per_token=0))
    cfg.update(model_type="flex_olmo", num_experts=spec.experts, num_experts_per_tok=spec.experts_per_token,
               norm_topk_prob=spec.expert_renorm, output_router_logits=False)
    return cfg


FLEX_OLMO = Family("flex_olmo", ("flex_olmo",), flex_olmo_from_hf, flex_olmo_to_hf, replace(olmo.WEIGHTS, block=(
    *(r for r in olmo.WEIGHTS.block if not r.ours.startswith("mlp.")),
    *(r for r in QWEN3_MOE.weights.block if r.ours.startswith("mlp.")))))
