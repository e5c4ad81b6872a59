"""Gemma (model_type gemma) and Gemma 2 and 3 (gemma2, gemma3_text): LLaMA's blocks with Gemma's
own touches.

Every Gemma: RMSNorms that scale by (1 + w) and keep w (initialised at 0), word embeddings
multiplied by sqrt(hidden) (the head, tied to them, is not), a gated tanh-GELU MLP (GeGLU),
heads of 256 dimensions whatever hidden / heads is.

Gemma 2 and 3 add a norm on each sublayer's output before its residual add (sandwich norms:
post_attention_layernorm, then pre_ and post_feedforward_layernorm), a sliding window on some
blocks (layer_types; by default every other block for Gemma 2, five in six for Gemma 3) and
an attention scale of query_pre_attn_scalar^-1/2. Gemma 2 caps the attention scores and the
logits, c * tanh(x / c). Gemma 3 normalises each head's q and k, and gives its windowed blocks
their own rotary base (10,000, unscaled) while the full ones use rope_theta (1,000,000, linear
scaling on the 4B and larger). The two layouts name the pre-MLP norm differently, so they are
two families: `gemma` and `gemma2`.

VaultGemma (vaultgemma) is Gemma 2 without the norms on the sublayers' outputs: pre_feedforward_layernorm is its
pre-MLP norm. The multimodal Gemma 3 (model_type gemma3: the 4B and larger) is read as its language model, a
gemma3_text (families.MULTIMODAL). Refused: bidirectional attention (EmbeddingGemma).
"""
from __future__ import annotations

import math
from dataclasses import replace

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import ACTIVATION_TO_HF, ConfigReader, Family, WeightMap, WeightRule
from planner.specs.families import llama
from planner.specs.model import MAX_BLOCKS, ModelSpec

HEAD_DIM = 256  # transformers' default for every Gemma
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma 3's rotary bases when its config names none
SLIDING_PATTERN = {"gemma2": 2, "vaultgemma": 2, "gemma3_text": 6}  # every n-th block is full, the others windowed


def _layer_types(cfg, model_type: str, blocks: int) -> ConfigReader:
    """The config with transformers' default layer_types filled in where it has none."""
    if model_type == "gemma" or cfg.cfg.get("layer_types") is not None:
        return cfg
    pattern = cfg.int("sliding_window_pattern", SLIDING_PATTERN[model_type]) if model_type == "gemma3_text" \
        else SLIDING_PATTERN[model_type]
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(blocks)]
    return ConfigReader({"sliding_window": 4096, **cfg.cfg, "layer_types": types}, cfg.source)


def _gemma3_rope(cfg) -> tuple[float, tuple, float]:
    """(global theta, global scaling, local theta): rope_parameters per layer type (transformers 5),
    or rope_theta, rope_scaling and rope_local_base_freq (the configs on the Hub)."""
    params = cfg.cfg.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise SailorError(f"model config {cfg.source}: rope_parameters must map each layer type to an object")
        theta, scaling = llama._rope(ConfigReader({"rope_parameters": {"rope_theta": GLOBAL_THETA, **full}},
                                                  cfg.source))
        _no_longrope(cfg, scaling)
        if local.get("rope_type", "default") != "default":
            raise SailorError(f"model config {cfg.source}: rope type {short(local.get('rope_type'))} of the "
                              "sliding-window layers is not supported; use default")
        return theta, scaling, cfg.number("rope_theta", local.get("rope_theta", LOCAL_THETA))
    theta, scaling = llama._rope(ConfigReader({**cfg.cfg, "rope_theta": cfg.cfg.get("rope_theta", GLOBAL_THETA)},
                                              cfg.source))
    _no_longrope(cfg, scaling)
    return theta, scaling, cfg.number("rope_local_base_freq", cfg.cfg.get("rope_local_base_freq", LOCAL_THETA))


def _no_longrope(cfg, scaling: tuple) -> None:
    """No Gemma 3 uses LongRoPE's short and long factors, and no test trains them beside its windowed blocks."""
    if dict(scaling).get("type") == "longrope":
        raise SailorError(f"model config {cfg.source}: rope type 'longrope' is not supported for gemma3_text; use "
                          "default, linear or llama3")


def _cap(cfg, key: str, default: float | None) -> float:
    value = cfg.cfg.get(key, default)
    return 0.0 if value is None else cfg.number(key, value)


def from_hf(cfg, model_type: str) -> dict:
    if cfg.bool("use_bidirectional_attention", False):
        raise SailorError(f"model config {cfg.source}: bidirectional attention (an embedding model) is not "
                          "supported; sailor trains causal language models")
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    head_dim = cfg.int("head_dim", HEAD_DIM)
    if model_type == "gemma":  # transformers reads the legacy "gelu" of the released configs as tanh-GELU
        act = cfg.str("hidden_act", "gelu_pytorch_tanh")
        activation = "gelu_tanh" if act == "gelu" else cfg.activation("hidden_act", "gelu_pytorch_tanh")
    else:
        activation = cfg.activation("hidden_activation", "gelu_pytorch_tanh")
    kv_heads = cfg.int("num_key_value_heads", heads)
    fields = dict(
        hidden=hidden, num_blocks=blocks, heads=heads, ffn_hidden=cfg.int("intermediate_size"),
        vocab=cfg.int("vocab_size"), max_positions=cfg.int("max_position_embeddings"),
        kv_heads=0 if kv_heads == heads else kv_heads, tied_embeddings=cfg.bool("tie_word_embeddings", True),
        gated_mlp=True, rms_norm=True, norm_offset=True, embedding_multiplier=hidden ** 0.5, learned_positions=False,
        qkv_bias=cfg.bool("attention_bias", False), out_bias=cfg.bool("attention_bias", False), mlp_bias=False,
        separate_final_norm=True, head_dim_override=head_dim if head_dim * heads != hidden else 0,
        activation=activation, norm_eps=cfg.float("rms_norm_eps", 1e-6), pad_token=cfg.pad_token(0),
    )
    if model_type == "gemma":
        fields["rope_theta"], fields["rope_scaling"] = llama._rope(cfg)
        return fields
    scalar = cfg.float("query_pre_attn_scalar", HEAD_DIM)
    fields.update(sandwich_norm=model_type != "vaultgemma",
                  windows=llama._windows(_layer_types(cfg, model_type, blocks), model_type, blocks),
                  attention_scale=0.0 if scalar == head_dim else scalar ** -0.5)
    if model_type in ("gemma2", "vaultgemma"):
        fields["rope_theta"], fields["rope_scaling"] = llama._rope(cfg)
        fields.update(attn_softcap=_cap(cfg, "attn_logit_softcapping", 50.0),
                      logit_softcap=_cap(cfg, "final_logit_softcapping", 30.0))
        return fields
    theta, scaling, local = _gemma3_rope(cfg)
    fields.update(rope_theta=theta, rope_scaling=scaling, local_rope_theta=local, qk_norm=True,
                  attn_softcap=_cap(cfg, "attn_logit_softcapping", None),
                  logit_softcap=_cap(cfg, "final_logit_softcapping", None))
    return fields


def _model_type(spec: ModelSpec) -> str:
    if spec.hf_model_type:
        return spec.hf_model_type
    if spec.family == "gemma":
        return "gemma"
    return "gemma3_text" if spec.qk_norm or spec.local_rope_theta else "gemma2"


def to_hf(spec: ModelSpec) -> dict:
    model_type = _model_type(spec)
    fits = spec.rms_norm and spec.norm_offset and spec.embedding_multiplier == spec.hidden ** 0.5 and \
        spec.gated_mlp and spec.residual_multiplier == 1 and spec.logits_divisor == 1 and \
        not spec.learned_positions and spec.qkv_bias == spec.out_bias and not spec.mlp_bias and \
        not spec.projected and spec.separate_final_norm and spec.rotary_fraction == 1.0 and \
        spec.sandwich_norm == (model_type not in ("gemma", "vaultgemma")) and \
        spec.qk_norm == (model_type == "gemma3_text") and \
        (model_type == "gemma3_text" or not spec.local_rope_theta) and \
        (model_type != "gemma" or not (spec.windows or spec.attention_scale or spec.attn_softcap or
                                       spec.logit_softcap))
    if not fits:
        raise SailorError(f"{spec.name} cannot be written as a {model_type} config: its layers differ from "
                          f"{model_type}'s")
    cfg = {
        "model_type": model_type, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "head_dim": spec.head_dim, "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "rms_norm_eps": spec.norm_eps,
        "attention_bias": spec.qkv_bias, "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
    }
    rope = llama.hf_rope(spec)
    if model_type == "gemma":
        return {**cfg, "hidden_act": "gelu_pytorch_tanh" if spec.activation == "gelu_tanh" else
                ACTIVATION_TO_HF[spec.activation], "rope_parameters": rope}
    windows = {w for w in spec.windows if w}
    if len(windows) > 1:
        raise SailorError(f"{spec.name}: {model_type}'s config has one sliding window, not {sorted(windows)}")
    scalar = spec.head_dim if not spec.attention_scale else spec.attention_scale ** -2
    if not math.isclose(scalar, round(scalar), rel_tol=1e-9):
        raise SailorError(f"{spec.name}: {model_type}'s config takes the attention scale as an integer "
                          f"query_pre_attn_scalar, not {scalar:g}")
    cfg.update({
        "hidden_activation": "gelu_pytorch_tanh" if spec.activation == "gelu_tanh" else
        ACTIVATION_TO_HF[spec.activation],
        "query_pre_attn_scalar": round(scalar), "sliding_window": windows.pop() if windows else None,
        "layer_types": ["sliding_attention" if spec.window(b) else "full_attention" for b in range(spec.num_blocks)],
        "attn_logit_softcapping": spec.attn_softcap or None, "final_logit_softcapping": spec.logit_softcap or None,
    })
    if model_type in ("gemma2", "vaultgemma"):
        return {**cfg, "rope_parameters": rope}
    local = {"rope_type": "default", "rope_theta": spec.local_rope_theta or spec.rope_theta}
    return {**cfg, "rope_parameters": {"full_attention": rope, "sliding_attention": local}}


def _sandwich_weights() -> WeightMap:
    """LLaMA's names (Gemma's), with Gemma 2's pre-MLP norm and the norms on the sublayers' outputs (which
    VaultGemma does not have)."""
    layer = "model.layers.{i}."
    block = [WeightRule(r.ours, (layer + "pre_feedforward_layernorm.weight",)) if r.ours == "pre_mlp_layernorm.weight"
             else r for r in llama.WEIGHTS.block]
    block += [WeightRule("post_attention_layernorm.weight", (layer + "post_attention_layernorm.weight",)),
              WeightRule("post_mlp_layernorm.weight", (layer + "post_feedforward_layernorm.weight",))]
    return replace(llama.WEIGHTS, block=tuple(block))


FAMILY = Family("gemma", ("gemma",), from_hf, to_hf, llama.WEIGHTS)  # LLaMA's names, tensor for tensor
FAMILY2 = Family("gemma2", ("gemma2", "gemma3_text", "vaultgemma"), from_hf, to_hf, _sandwich_weights())
