"""EXAONE 4.0 (model_type exaone4): OLMo 2's blocks with Qwen3's per-head q/k norms, and hybrid attention;
EXAONE 3.0 and 3.5 (model_type exaone): LLaMA's blocks under tensor names of their own; K-EXAONE (exaone_moe):
EXAONE 4's attention in LLaMA's pre-norm blocks, with DeepSeek-V3's experts (deepseek.py) on the blocks
mlp_layer_types names sparse (by default all but the first first_k_dense_replace).

A block is x + norm(attn(x)), then x + norm(mlp(x)) (no norm before a sublayer, as OLMo 2: olmo.py);
q and k are each normalised per head before the rotary positions (qk_norm, as Qwen3). With a
sliding_window, three blocks in four are windowed (layer_types, or sliding_window_pattern: an
integer n, every n-th block full, or letters such as "LLLG", L windowed and G full) and only the
windowed blocks have rotary positions: the full ones have none (NoPE). Without a window every block
is full and rotary.
"""
from __future__ import annotations

from planner.errors import SailorError
from planner.inputs import short
from dataclasses import replace

from planner.specs.families import (ACTIVATION_TO_HF, ConfigReader, Family, WeightMap, WeightRule, deepseek, llama, moe,
                                    olmo)
from planner.specs.model import MAX_BLOCKS, ModelSpec


def _layer_types(cfg, blocks: int) -> list[str]:
    types = cfg.cfg.get("layer_types")
    if types is None:
        pattern = cfg.cfg.get("sliding_window_pattern", 4)
        if isinstance(pattern, str):
            if not pattern or not set(pattern) <= {"L", "G"}:
                raise SailorError(f"model config {cfg.source}: sliding_window_pattern must be a positive integer or "
                                  f"letters L (windowed) and G (full), not {short(pattern)}")
            types = ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"
                     for i in range(blocks)]
        else:
            types = llama.every_nth_full(blocks, cfg.int("sliding_window_pattern", 4))
    return llama.check_layer_types(cfg, types, blocks)


def from_hf(cfg, model_type: str) -> dict:
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)
    # LLaMA's fields without its reading of layer_types (without a window, every block is full)
    plain = ConfigReader({k: v for k, v in cfg.cfg.items() if k != "layer_types"}, cfg.source)
    fields = {**llama.from_hf(plain, "llama"), "qk_norm": True, "input_norms": False, "sandwich_norm": True}
    if cfg.has("sliding_window"):
        width = cfg.int("sliding_window")
        windows = tuple(width if t == "sliding_attention" else 0 for t in _layer_types(cfg, blocks))
        fields.update(windows=windows if any(windows) else (),
                      nope_blocks=tuple(i for i, w in enumerate(windows) if not w))
    return fields


def to_hf(spec: ModelSpec) -> dict:
    windows = {w for w in spec.windows if w}
    full = tuple(i for i in range(spec.num_blocks) if not spec.window(i))
    if not (spec.qk_norm and not spec.qk_norm_full and not spec.input_norms and spec.sandwich_norm) or \
            spec.qkv_bias or spec.out_bias or spec.mlp_bias or len(windows) > 1 or \
            spec.nope_blocks != (full if windows else ()):
        raise SailorError(f"{spec.name} cannot be written as an exaone4 config: its layers differ from EXAONE 4's")
    return {
        "model_type": "exaone4", "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups, "head_dim": spec.head_dim,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab, "max_position_embeddings": spec.context_length,
        "rms_norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation],
        "rope_parameters": llama.hf_rope(spec), "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
        "sliding_window": windows.pop() if windows else None,
        "layer_types": ["sliding_attention" if spec.window(i) else "full_attention" for i in range(spec.num_blocks)],
    }


FAMILY = Family("exaone4", ("exaone4",), from_hf, to_hf, olmo.WEIGHTS)  # OLMo 2's tensor names


# EXAONE 3: transformers builds LLaMA from its config (num_layers, layer_norm_epsilon and activation_function are
# read as LLaMA's fields: families.FIELD_ALIASES) and renames its tensors on loading; it saves them under these names
_LAYER = "transformer.h.{i}."
_NAMES = {"model.embed_tokens.": "transformer.wte.", "model.norm.": "transformer.ln_f.",
          "model.layers.{i}.": _LAYER, "self_attn.o_proj": "attn.attention.out_proj", "self_attn.": "attn.attention.",
          "input_layernorm": "ln_1", "post_attention_layernorm": "ln_2", "mlp.gate_proj": "mlp.c_fc_0",
          "mlp.up_proj": "mlp.c_fc_1", "mlp.down_proj": "mlp.c_proj"}


def _exaone3_name(name: str) -> str:
    for theirs, ours in _NAMES.items():
        name = name.replace(theirs, ours)
    return name


def _exaone3_rules(rules: tuple[WeightRule, ...]) -> tuple[WeightRule, ...]:
    return tuple(replace(r, hf=tuple(_exaone3_name(n) for n in r.hf)) for r in rules)


EXAONE3_WEIGHTS = WeightMap(*(_exaone3_rules(getattr(llama.WEIGHTS, part)) for part in
                              ("embedding", "block", "final_norm", "head")))


def exaone3_to_hf(spec: ModelSpec) -> dict:
    return {**llama.family_to_hf(replace(spec, hf_model_type="exaone")), "model_type": "exaone"}


EXAONE3 = Family("exaone", ("exaone",), llama.from_hf, exaone3_to_hf, EXAONE3_WEIGHTS)


def moe_from_hf(cfg, model_type: str) -> dict:
    deepseek.refuse_quantization(cfg)
    moe.refuse_router_logits(cfg)
    fields = {**from_hf(cfg, "exaone4"), "input_norms": True, "sandwich_norm": False}  # (LLaMA's pre-norms)
    experts = deepseek.sigmoid_experts(cfg, deepseek.V3_DEFAULTS, fields["num_blocks"])
    if cfg.cfg.get("mlp_layer_types") is not None:  # (before first_k_dense_replace, as in transformers)
        experts.update(deepseek.mlp_types(cfg, fields["num_blocks"]))
    return {**fields, **experts}


def moe_to_hf(spec: ModelSpec) -> dict:
    if not spec.experts or not spec.input_norms or spec.sandwich_norm:
        raise SailorError(f"{spec.name} cannot be written as an exaone_moe config: its layers differ from "
                          "exaone_moe's")
    cfg = to_hf(replace(spec, input_norms=False, sandwich_norm=True, experts=0, experts_per_token=0,
                        shared_expert_ffn=0, router_sigmoid=False, expert_score_bias=False, expert_groups=1,
                        expert_groups_per_token=1, routed_scale=1.0, dense_blocks=(), dense_ffn=0,
                        shared_expert_gated=True))
    # (its dense blocks may be anywhere: mlp_layer_types)
    experts = deepseek.experts_to_hf(replace(spec, dense_blocks=(), dense_ffn=0), "exaone_moe")
    experts.update(num_experts=experts.pop("n_routed_experts"), num_shared_experts=experts.pop("n_shared_experts"),
                   first_k_dense_replace=0, intermediate_size=spec.dense_ffn or spec.ffn_hidden,
                   mlp_layer_types=["dense" if spec.dense(i) else "sparse" for i in range(spec.num_blocks)])
    return {**cfg, **experts, "model_type": "exaone_moe"}


# LLaMA's pre-norms and MLP (on the dense blocks), Qwen3's q/k norm names, DeepSeek-V3's experts with the score
# biases beside the router
MOE_WEIGHTS = replace(llama.WEIGHTS, block=(
    *(r for r in llama.WEIGHTS.block if not r.ours.startswith("mlp.")),
    *(replace(r, hf=("model.layers.{i}.mlp.e_score_correction_bias",)) if r.ours == "mlp.router.score_bias" else r
      for r in deepseek.EXPERT_RULES)))
EXAONE_MOE = Family("exaone_moe", ("exaone_moe",), moe_from_hf, moe_to_hf, MOE_WEIGHTS)
