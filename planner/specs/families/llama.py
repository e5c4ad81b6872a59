"""LLaMA, Mistral, Ministral, Ministral 3, Qwen2, Qwen3, Granite, SmolLM3, ERNIE 4.5, Seed-OSS, Helium, CWM, InternLM3
and IQuest-Coder: RMSNorm, SwiGLU, rotary positions, grouped-query attention.

Differences inside the family are config fields: Qwen2 has q/k/v biases,
Qwen3 normalises each head's q and k (an RMSNorm over the head dimension,
before the rotary positions) and sets the head dimension itself (128 unless
its config says otherwise), Mistral, Qwen2 and Qwen3 may use sliding-window
attention (per layer through `layer_types`), LLaMA 3.1 scales its rotary
frequencies (`rope_scaling` type llama3), small models tie the head to the
embedding. Granite multiplies the embeddings (embedding_multiplier) and each
residual branch (residual_multiplier), scales attention by attention_multiplier
(1 unless set, not 1/sqrt(head_dim)) and divides the logits (logits_scaling). SmolLM3 leaves
the rotary positions out of some blocks (no_rope_layers: 0 for such a block; by default every
fourth), which alone may be windowed. ERNIE 4.5 rotates adjacent pairs of dimensions (interleaved),
has biases on every linear or none (use_bias) and heads of 128 unless its config says otherwise.
Seed-OSS has q/k/v biases (attention_bias, on by default) and a field of its own for the output
projection's (attention_out_bias); Helium rotates adjacent pairs too, with q/k/v biases only.
Ministral 3 is Mistral with heads of 128, YaRN by default, and q scaled beyond the original context
(rope_parameters' llama_4_scaling_beta: ModelSpec.query_scale_beta). Ministral (8B) is Mistral without biases;
Meta's CWM windows three blocks in four by default and has no attention biases; InternLM3 and IQuest-Coder are
LLaMA with other defaults (AS_LLAMA).
"""
from __future__ import annotations

import math

from planner.errors import SailorError
from planner.inputs import FLOAT_MAX, short
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.model import MAX_BLOCKS, ModelSpec

ROPE_TYPES = ("default", "llama3", "linear", "longrope", "yarn", "dynamic")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")
QWEN3_HEAD_DIM = 128  # transformers' Qwen3Config default, whatever hidden_size / num_attention_heads is
# their configs' head_dim defaults to 128 (QWEN3_HEAD_DIM)
HEAD_128 = ("qwen3", "ernie4_5", "seed_oss", "helium", "ministral3", "internlm3", "iquestcoder", "cwm")
INTERLEAVED = ("ernie4_5", "helium")  # rotary positions on adjacent pairs of dimensions
# model types whose rope type dynamic with an alpha stretches the base by NTK alpha for every sequence, as
# transformers builds them (hunyuan.py): base * alpha^(d / (d - 2))
NTK_ALPHA = ("hunyuan_v1_dense", "hunyuan_v1_moe")
_ROPE_KEYS = {"llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
              "linear": ("factor",), "dynamic": ("factor",), "default": ()}
# model types that transformers builds as LLaMA (LlamaForCausalLM) from configs of their own: the same blocks, other
# defaults (HF_DEFAULTS) and field names (FIELD_ALIASES); no windows, whatever a config says. (EXAONE 3's tensors
# have names of their own: exaone.py)
AS_LLAMA = ("internlm3", "iquestcoder", "exaone")


def _rope(cfg) -> tuple[float, tuple]:
    """(theta, scaling) from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older).
    As transformers reads them: a non-empty rope_scaling wins over rope_parameters, and a rope_theta inside
    the one read wins over the top-level one. Dynamic NTK scaling (InternLM3) raises the base only for
    sequences beyond max_position_embeddings, which sailor never trains (ModelSpec refuses a longer
    --seq-length): inside the context its frequencies are the default ones, and it is kept for export."""
    for key in ("rope_scaling", "rope_parameters"):
        if cfg.cfg.get(key) is not None and not isinstance(cfg.cfg[key], dict):
            raise SailorError(f"model config {cfg.source}: {key} must be an object, not {short(cfg.cfg[key])}")
    params = dict(cfg.cfg.get("rope_scaling") or cfg.cfg.get("rope_parameters") or {})
    if cfg.has("rope_theta"):
        params.setdefault("rope_theta", cfg.cfg["rope_theta"])
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("su", "yarn") and cfg.cfg.get("model_type") == "phi3":  # Phi-3's early names for longrope
        kind = "longrope"
    if kind == "mrope":  # Qwen2-VL's name for its multimodal sections, which turn text as the default does
        kind = "default"
    if kind == "dynamic" and params.get("alpha") is not None and cfg.cfg.get("model_type") in NTK_ALPHA:
        return cfg.number("rope rope_theta", params.get("rope_theta", cfg.cfg.get("rope_theta", 10000.0))), \
            (("alpha", cfg.number("rope alpha", params["alpha"])), ("type", "ntk_alpha"))
    if kind not in ROPE_TYPES:
        raise SailorError(f"model config {cfg.source}: rope type {short(kind)} is not supported; use one of "
                          f"{', '.join(ROPE_TYPES)}")
    theta = params.get("rope_theta", cfg.cfg.get("rope_theta", 10000.0))  # (transformers' order)
    if kind == "longrope":
        return cfg.number("rope rope_theta", theta), _longrope(cfg, params)
    if kind == "yarn":
        return cfg.number("rope rope_theta", theta), _yarn(cfg, params)
    values = {key: cfg.number(f"rope {key}", theta if key == "rope_theta" else params.get(key))
              for key in ("rope_theta", *_ROPE_KEYS[kind])}
    scaling = () if kind == "default" else tuple(sorted({"type": kind, **{k: values[k] for k in _ROPE_KEYS[kind]}}
                                                        .items()))
    return values["rope_theta"], scaling


def _longrope(cfg, params: dict) -> tuple:
    """LongRoPE (Phi-3's 128k models, Phi-3.5, Phi-4-mini): each rotary frequency divided by its own
    factor, the short ones up to the original context and the long ones beyond it, and cos and sin
    scaled by an attention factor, sqrt(1 + ln(factor) / ln(original context)) unless the config
    sets it (factor: the context over the original one unless set)."""
    lists = {}
    for key in ("short_factor", "long_factor"):
        value = params.get(key)
        if not isinstance(value, list) or not value or any(
                isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= FLOAT_MAX for x in value):
            raise SailorError(f"model config {cfg.source}: rope {key} must be a list of positive numbers, not "
                              f"{short(value)}")
        lists[key] = tuple(float(x) for x in value)
    original = _original_context(cfg, params)
    factor = params.get("factor")
    factor = cfg.int("max_position_embeddings") / original if factor is None else cfg.number("rope factor", factor)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return tuple(sorted({"type": "longrope", **lists, "original_max_position_embeddings": original,
                         "attention_factor": cfg.number("rope attention_factor", attention)}.items()))


def _original_context(cfg, params: dict) -> float:
    original = params.get("original_max_position_embeddings", cfg.cfg.get("original_max_position_embeddings"))
    if isinstance(original, bool) or not isinstance(original, (int, float)) or not 1 < original <= FLOAT_MAX or \
            original != int(original):
        raise SailorError(f"model config {cfg.source}: rope original_max_position_embeddings must be the original "
                          f"context length, a whole number of tokens above 1, not {short(original)}")
    return float(original)


def _yarn(cfg, params: dict) -> tuple:
    """YaRN (Qwen2.5/3 long context, OLMo 3, DeepSeek): frequencies with fewer than beta_slow rotations
    over the original context are divided by `factor`, those with more than beta_fast are kept, and a
    linear ramp over the dimensions in between blends the two (sailor_ext.attention); cos and sin are
    scaled by an attention factor, 0.1 ln(factor) + 1 unless the config sets it or gives mscale and
    mscale_all_dim (the ratio of that form with each). factor: the context over the original one
    unless set; truncate: the ramp's ends rounded outwards to whole dimensions (default)."""
    original = _original_context(cfg, params)
    factor = params.get("factor")
    factor = cfg.int("max_position_embeddings") / original if factor is None else cfg.number("rope factor", factor)

    def mscale(scale: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = (params.get(k) for k in ("mscale", "mscale_all_dim"))
        attention = mscale(cfg.number("rope mscale", m)) / mscale(cfg.number("rope mscale_all_dim", m_all)) \
            if m and m_all else mscale(1.0)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise SailorError(f"model config {cfg.source}: rope truncate must be true or false, not {short(truncate)}")
    return tuple(sorted({"type": "yarn", "factor": factor, "original_max_position_embeddings": original,
                         "attention_factor": cfg.number("rope attention_factor", attention),
                         "beta_fast": cfg.number("rope beta_fast", params.get("beta_fast") or 32),
                         "beta_slow": cfg.number("rope beta_slow", params.get("beta_slow") or 1),
                         "truncate": float(truncate)}.items()))


def _windows(cfg, model_type: str, blocks: int) -> tuple[int, ...]:
    """Sliding-window width per block (0: full attention)."""
    window = cfg.cfg.get("sliding_window")
    layer_types = cfg.cfg.get("layer_types")
    if model_type == "qwen3_moe":  # every block windowed, or none
        return (cfg.int("sliding_window"),) * blocks if cfg.bool("use_sliding_window", False) else ()
    if model_type == "qwen2_moe" and layer_types is None:  # odd blocks below max_window_layers, if any
        if not cfg.bool("use_sliding_window", False):
            return ()
        first = cfg.int("max_window_layers", 28)
        layer_types = ["sliding_attention" if (i + 1) % 2 and i < first else "full_attention" for i in range(blocks)]
    if model_type in ("qwen2", "qwen3") and layer_types is None:
        if not cfg.bool("use_sliding_window", False):
            return ()
        first = cfg.int("max_window_layers", blocks)
        layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(blocks)]
    if model_type in ("llama", "granite", "apertus", *AS_LLAMA, *NTK_ALPHA):  # (transformers' LLaMA, Granite,
        # Apertus and HunYuan attend to every token, whatever sliding_window and layer_types say)
        return ()
    if model_type == "dots1" and layer_types is None:  # the blocks from max_window_layers on, given a window
        if window is None:
            return ()
        first = cfg.int("max_window_layers", blocks)
        layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(blocks)]
    if model_type == "cwm" and layer_types is None:  # every fourth block full, from the first (CwmConfig's default)
        if window is None:
            return ()
        layer_types = ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(blocks)]
    if model_type == "smollm3":  # windows on the blocks without rotary positions, and only with use_sliding_window
        if not cfg.bool("use_sliding_window", False) or window is None:
            return ()
        if layer_types is None:
            nope = set(_nope_blocks(cfg, blocks))
            layer_types = ["sliding_attention" if i in nope else "full_attention" for i in range(blocks)]
    if layer_types is None:
        if window is None:
            return ()
        layer_types = ["sliding_attention"] * blocks
    check_layer_types(cfg, layer_types, blocks)
    if "sliding_attention" not in layer_types:
        return ()
    width = cfg.int("sliding_window")
    return tuple(width if t == "sliding_attention" else 0 for t in layer_types)


def every_nth_full(blocks: int, n: int) -> list[str]:
    """layer_types with every n-th block full and the others windowed (the default of several families)."""
    return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(blocks)]


def check_layer_types(cfg, layer_types, blocks: int) -> list[str]:
    """A config's layer_types: full_attention or sliding_attention for each block."""
    if not isinstance(layer_types, list) or len(layer_types) != blocks or \
            any(t not in ("sliding_attention", "full_attention") for t in layer_types):
        raise SailorError(f"model config {cfg.source}: layer_types must list full_attention or sliding_attention "
                          f"for each of the {blocks} layers, not {short(layer_types)}")
    return layer_types


def _nope_blocks(cfg, blocks: int) -> tuple[int, ...]:
    """SmolLM3's blocks without rotary positions: no_rope_layers (1: rotary, 0: none, one per block), or
    every no_rope_layer_interval-th block (default 4)."""
    flags = cfg.cfg.get("no_rope_layers")
    if flags is None:
        interval = cfg.int("no_rope_layer_interval", 4)
        return tuple(i for i in range(blocks) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) != blocks or any(f not in (0, 1) or isinstance(f, float)
                                                                  for f in flags):
        raise SailorError(f"model config {cfg.source}: no_rope_layers must list 1 (rotary positions) or 0 (none) "
                          f"for each of the {blocks} layers")
    return tuple(i for i, f in enumerate(flags) if not f)


def from_hf(cfg, model_type: str) -> dict:
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    kv_heads = cfg.int("num_key_value_heads", heads)
    blocks = cfg.int("num_hidden_layers", hi=MAX_BLOCKS)  # before it sizes the per-layer lists
    head_dim = cfg.int("head_dim", QWEN3_HEAD_DIM if model_type in HEAD_128 else hidden // heads if heads else 1)
    if model_type == "helium" and head_dim * heads != hidden:  # its output projection is hidden -> hidden
        raise SailorError(f"model config {cfg.source}: helium needs num_attention_heads x head_dim = hidden_size "
                          f"({heads} x {head_dim} != {hidden}); fix head_dim")
    # (Ministral's and CWM's attention has no biases, whatever attention_bias says; Ministral's MLP has none either)
    attention_bias = False if model_type in ("ministral", "cwm") else \
        cfg.bool("use_bias" if model_type == "ernie4_5" else "attention_bias", False)
    mlp_bias = attention_bias if model_type == "ernie4_5" else False if model_type == "ministral" else \
        cfg.bool("mlp_bias", False)
    if model_type == "internlm3" and attention_bias != mlp_bias:  # (transformers refuses it too)
        raise SailorError(f"model config {cfg.source}: internlm3 puts a bias on every linear or on none; set qkv_bias "
                          f"and bias alike")
    if model_type == "iquestcoder" and (cfg.has("clip_qkv") or cfg.bool("use_sliding_window", False)):
        raise SailorError(f"model config {cfg.source}: clip_qkv and use_sliding_window are not supported for "
                          "iquestcoder (transformers refuses them too); remove them")
    # the output projection's bias: as q/k/v's, except Qwen2 (q/k/v only), Seed-OSS (its own field), Helium (none)
    out_bias = False if model_type in ("qwen2", "helium") else cfg.bool("attention_out_bias", False) \
        if model_type == "seed_oss" else attention_bias
    theta, scaling = _rope(cfg)
    return dict(
        hidden=hidden, num_blocks=blocks, heads=heads, ffn_hidden=cfg.int("intermediate_size"),
        vocab=cfg.int("vocab_size"), max_positions=cfg.int("max_position_embeddings"),
        kv_heads=0 if kv_heads == heads else kv_heads, tied_embeddings=cfg.bool("tie_word_embeddings", False),
        gated_mlp=True, rms_norm=True, learned_positions=False,
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        out_bias=out_bias, mlp_bias=mlp_bias, separate_final_norm=True,
        head_dim_override=head_dim if head_dim * heads != hidden else 0,
        activation=cfg.activation("hidden_act", "silu"), norm_eps=cfg.float("rms_norm_eps", 1e-6),
        windows=_windows(cfg, model_type, blocks), rope_theta=theta, rope_scaling=scaling,
        pad_token=cfg.pad_token(None), qk_norm=model_type in QK_NORM_TYPES,
        nope_blocks=_nope_blocks(cfg, blocks) if model_type == "smollm3" else (),
        rotary_interleaved=model_type in INTERLEAVED,
        **(_granite(cfg) if model_type == "granite" else {}),
        **(_query_scale(cfg) if model_type == "ministral3" else {}),
    )


def _query_scale(cfg) -> dict:
    """Ministral 3's query scale: llama_4_scaling_beta over the original context, both read from the rotary
    parameters (transformers fails without them)."""
    params = dict(cfg.cfg.get("rope_scaling") or cfg.cfg.get("rope_parameters") or {})
    beta = params.get("llama_4_scaling_beta")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta <= FLOAT_MAX:
        raise SailorError(f"model config {cfg.source}: rope llama_4_scaling_beta must be a number >= 0, not "
                          f"{short(beta)}")
    return dict(query_scale_beta=float(beta), query_scale_span=int(_original_context(cfg, params)))


def _granite(cfg) -> dict:
    """Granite's multipliers; an attention_multiplier set to null is PyTorch's default scale, 1/sqrt(head_dim), as
    transformers passes it on (left out, it is 1)."""
    null_scale = "attention_multiplier" in cfg.cfg and cfg.cfg["attention_multiplier"] is None
    return dict(embedding_multiplier=cfg.float("embedding_multiplier", 1.0),
                residual_multiplier=cfg.float("residual_multiplier", 1.0),
                attention_scale=0.0 if null_scale else cfg.float("attention_multiplier", 1.0),
                logits_divisor=cfg.float("logits_scaling", 1.0))


def hf_rope(spec: ModelSpec) -> dict:
    """transformers' rope_parameters for the spec's base and scaling (lists for LongRoPE's factors)."""
    scaling = dict(spec.rope_scaling)
    rope = {"rope_type": scaling.pop("type", "default"), "rope_theta": spec.rope_theta}
    if rope["rope_type"] == "ntk_alpha":  # (HunYuan's: dynamic with an alpha, its factor unread)
        rope.update(rope_type="dynamic", factor=1.0)
    for key, value in scaling.items():
        rope[key] = list(value) if isinstance(value, tuple) else \
            int(value) if key == "original_max_position_embeddings" else bool(value) if key == "truncate" else value
    return rope


def to_hf(spec: ModelSpec) -> dict:
    scaled = (spec.embedding_multiplier, spec.residual_multiplier, spec.logits_divisor) != (1, 1, 1) or \
        spec.attention_scale
    model_type = spec.hf_model_type or ("qwen3" if spec.qk_norm else "granite" if scaled else
                                        "qwen2" if spec.qkv_bias and not spec.out_bias else "llama")
    if spec.qk_norm != (model_type in QK_NORM_TYPES):
        raise SailorError(f"{spec.name}: per-head q/k norms are qwen3's alone; the model and its model_type "
                          f"{model_type} disagree")
    if scaled and model_type != "granite":
        raise SailorError(f"{spec.name}: multipliers on embeddings, residual branches, attention or logits are "
                          f"granite's alone; {model_type}'s config cannot express them")
    if bool(spec.query_scale_span) != (model_type == "ministral3"):
        raise SailorError(f"{spec.name}: a query scale that grows with the position is ministral3's alone, and "
                          f"always there; {model_type}'s config cannot express the model")
    if spec.nope_blocks and model_type != "smollm3":
        raise SailorError(f"{spec.name}: blocks without rotary positions are smollm3's alone here; {model_type}'s "
                          "config cannot express them")
    if spec.rotary_interleaved != (model_type in INTERLEAVED):  # (always there, never elsewhere)
        raise SailorError(f"{spec.name}: rotary positions on adjacent pairs are {' and '.join(INTERLEAVED)}'s, "
                          f"and theirs only; {model_type}'s config cannot express the model")
    if model_type == "ernie4_5" and len({spec.qkv_bias, spec.out_bias, spec.mlp_bias}) > 1:
        raise SailorError(f"{spec.name}: ernie4_5's config puts biases on every linear or none")
    if model_type == "helium" and (spec.out_bias or spec.head_dim_override):
        raise SailorError(f"{spec.name}: helium's config cannot express a bias on the attention's output or a head "
                          "dimension other than hidden_size / num_attention_heads")
    cfg = {
        "model_type": model_type, "hidden_size": spec.hidden, "num_hidden_layers": spec.num_blocks,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.num_query_groups,
        "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "head_dim": spec.head_dim,
        "rms_norm_eps": spec.norm_eps, "hidden_act": ACTIVATION_TO_HF[spec.activation],
        "rope_parameters": hf_rope(spec), "tie_word_embeddings": spec.tied_embeddings,
        "pad_token_id": spec.pad_token if spec.pad_token >= 0 else None,
    }
    if model_type == "ministral3":
        cfg["rope_parameters"].update(llama_4_scaling_beta=spec.query_scale_beta,
                                      original_max_position_embeddings=spec.query_scale_span)
    if model_type in ("llama", "granite", "smollm3", "seed_oss", "helium", *AS_LLAMA):
        cfg.update(attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias)
    if model_type == "seed_oss":
        cfg["attention_out_bias"] = spec.out_bias
    elif model_type in ("llama", "granite", "smollm3", *AS_LLAMA) and spec.qkv_bias != spec.out_bias:
        raise SailorError(f"{spec.name}: {model_type}'s config puts a bias on q, k, v and the output projection "
                          "alike")
    if model_type == "internlm3" and spec.qkv_bias != spec.mlp_bias or \
            model_type in ("ministral", "cwm") and (spec.qkv_bias or spec.out_bias or
                                                    spec.mlp_bias and model_type == "ministral"):
        raise SailorError(f"{spec.name}: {model_type}'s config cannot express the model's biases")
    if model_type == "cwm":
        cfg["mlp_bias"] = spec.mlp_bias
    if model_type == "smollm3":
        cfg["no_rope_layers"] = [int(i not in spec.nope_blocks) for i in range(spec.num_blocks)]
    if model_type == "ernie4_5":
        cfg["use_bias"] = spec.qkv_bias
    if model_type == "granite":
        cfg.update(embedding_multiplier=spec.embedding_multiplier, residual_multiplier=spec.residual_multiplier,
                   attention_multiplier=spec.attention_scale or spec.head_dim ** -0.5,
                   logits_scaling=spec.logits_divisor)
    if model_type == "qwen3":
        cfg.update(attention_bias=spec.qkv_bias)
    windows = {w for w in spec.windows if w}
    if windows:
        if len(windows) > 1:
            raise SailorError(f"{spec.name}: blocks use different attention windows {sorted(windows)}, which "
                              f"{model_type}'s config cannot express")
        cfg["sliding_window"] = windows.pop()
        cfg["layer_types"] = ["sliding_attention" if w else "full_attention" for w in spec.windows]
        if model_type in ("qwen2", "qwen3", "smollm3"):
            cfg["use_sliding_window"] = True
    elif model_type in ("mistral", "ministral", "ministral3", "qwen2", "qwen3"):
        cfg["sliding_window"] = None
    elif model_type == "cwm":  # (its default windows three blocks in four; its config takes no null window)
        cfg.update(sliding_window=spec.context_length, layer_types=["full_attention"] * spec.num_blocks)
    return cfg


def family_to_hf(spec: ModelSpec) -> dict:
    """to_hf for a model of this family: transformers' LLaMA, Granite and the types it builds as LLaMA attend to
    every token, so a model with windows is refused rather than written as one that loses them. (Other families
    write their attention's fields with to_hf, and windows of their own.)"""
    model_type = spec.hf_model_type or "llama"
    if any(spec.windows) and model_type in ("llama", "granite", *AS_LLAMA):
        raise SailorError(f"{spec.name}: {model_type}'s blocks attend to every token; its config cannot express "
                          "attention windows")
    return to_hf(spec)


_LAYER = "model.layers.{i}."
WEIGHTS = WeightMap(
    embedding=(WeightRule("word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),),
    block=(
        WeightRule("input_layernorm.weight", (_LAYER + "input_layernorm.weight",)),
        WeightRule("self_attention.linear_qkv.weight", tuple(_LAYER + f"self_attn.{x}_proj.weight" for x in "qkv"),
                   "qkv"),
        WeightRule("self_attention.linear_qkv.bias", tuple(_LAYER + f"self_attn.{x}_proj.bias" for x in "qkv"),
                   "qkv"),
        WeightRule("self_attention.q_layernorm.weight", (_LAYER + "self_attn.q_norm.weight",)),
        WeightRule("self_attention.k_layernorm.weight", (_LAYER + "self_attn.k_norm.weight",)),
        WeightRule("self_attention.linear_proj.weight", (_LAYER + "self_attn.o_proj.weight",)),
        WeightRule("self_attention.linear_proj.bias", (_LAYER + "self_attn.o_proj.bias",)),
        WeightRule("pre_mlp_layernorm.weight", (_LAYER + "post_attention_layernorm.weight",)),
        WeightRule("mlp.linear_fc1.weight", (_LAYER + "mlp.gate_proj.weight", _LAYER + "mlp.up_proj.weight"),
                   "gate_up"),
        WeightRule("mlp.linear_fc1.bias", (_LAYER + "mlp.gate_proj.bias", _LAYER + "mlp.up_proj.bias"), "gate_up"),
        WeightRule("mlp.linear_fc2.weight", (_LAYER + "mlp.down_proj.weight",)),
        WeightRule("mlp.linear_fc2.bias", (_LAYER + "mlp.down_proj.bias",)),
    ),
    final_norm=(WeightRule("final_layernorm.weight", ("model.norm.weight",)),),
    head=(WeightRule("output_layer.weight", ("lm_head.weight",), "vocab"),),
)

FAMILY = Family("llama", ("llama", "mistral", "ministral", "ministral3", "qwen2", "qwen3", "granite", "smollm3",
                          "ernie4_5", "seed_oss", "helium", "cwm", "internlm3", "iquestcoder"),
                from_hf, family_to_hf, WEIGHTS)
