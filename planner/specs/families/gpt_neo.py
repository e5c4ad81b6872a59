"""GPT-Neo: GPT-2's layout without q/k/v biases and without attention scaling,
alternating global and local (sliding-window) attention layers."""
from __future__ import annotations

from planner.errors import SailorError
from planner.specs.families import ACTIVATION_TO_HF, Family, WeightMap, WeightRule
from planner.specs.model import MAX_BLOCKS, ModelSpec


def _attention_layers(cfg, blocks: int) -> list[str]:
    layers = cfg.cfg.get("attention_layers")
    if layers is None:  # attention_types: [[["global", "local"], 16]] repeats a pattern
        layers = []
        try:
            for pattern, repeat in cfg.cfg.get("attention_types") or [[["global"], blocks]]:
                if type(repeat) is not int or not 0 < repeat <= blocks:  # checked before it multiplies
                    raise ValueError
                layers += list(pattern) * repeat
                if len(layers) > blocks:
                    break  # too many: refused below
        except (TypeError, ValueError):
            raise SailorError(f"model config {cfg.source}: attention_types must look like "
                              '[[["global", "local"], 16]], each pattern repeated a whole number of times '
                              f"(1 to {blocks})") from None
    if not isinstance(layers, list) or len(layers) != blocks or any(t not in ("global", "local") for t in layers):
        raise SailorError(f"model config {cfg.source}: attention layers must name global or local for each of the "
                          f"{blocks} layers")
    return layers


def from_hf(cfg, model_type: str) -> dict:
    hidden, blocks = cfg.int("hidden_size"), cfg.int("num_layers", hi=MAX_BLOCKS)  # before it sizes a list
    window = cfg.int("window_size", 256)
    return dict(
        hidden=hidden, num_blocks=blocks, heads=cfg.int("num_heads"),
        ffn_hidden=cfg.int("intermediate_size", 4 * hidden), vocab=cfg.int("vocab_size"),
        max_positions=cfg.int("max_position_embeddings"), tied_embeddings=cfg.bool("tie_word_embeddings", True),
        qkv_bias=False, activation=cfg.activation("activation_function", "gelu_new"),
        norm_eps=cfg.float("layer_norm_epsilon", 1e-5), attention_scale=1.0,
        windows=tuple(window if t == "local" else 0 for t in _attention_layers(cfg, blocks)),
    )


def to_hf(spec: ModelSpec) -> dict:
    windows = {w for w in spec.windows if w}
    if spec.rms_norm or spec.gated_mlp or not spec.learned_positions or spec.projected or spec.post_norm \
            or spec.qkv_bias or not (spec.out_bias and spec.mlp_bias) or len(windows) > 1 \
            or spec.kv_heads not in (0, spec.heads) or spec.head_dim_override or spec.attention_scale != 1.0:
        raise SailorError(f"{spec.name} cannot be written as a GPT-Neo config: its layers differ from GPT-Neo's")
    return {
        "model_type": "gpt_neo", "hidden_size": spec.hidden, "num_layers": spec.num_blocks,
        "num_heads": spec.heads, "intermediate_size": spec.ffn_hidden, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context_length, "window_size": windows.pop() if windows else 256,
        "attention_layers": ["local" if w else "global" for w in (spec.windows or (0,) * spec.num_blocks)],
        "attention_types": [[["local" if w else "global"], 1] for w in (spec.windows or (0,) * spec.num_blocks)],
        "layer_norm_epsilon": spec.norm_eps, "activation_function": ACTIVATION_TO_HF[spec.activation],
        "tie_word_embeddings": spec.tied_embeddings,
        "embed_dropout": 0.0, "attention_dropout": 0.0, "resid_dropout": 0.0,
    }


_LAYER = "transformer.h.{i}."
WEIGHTS = WeightMap(
    embedding=(
        WeightRule("word_embeddings.weight", ("transformer.wte.weight",), "vocab"),
        WeightRule("position_embeddings.weight", ("transformer.wpe.weight",)),
    ),
    block=(
        *(WeightRule(f"input_layernorm.{p}", (_LAYER + f"ln_1.{p}",)) for p in ("weight", "bias")),
        WeightRule("self_attention.linear_qkv.weight",
                   tuple(_LAYER + f"attn.attention.{x}_proj.weight" for x in "qkv"), "qkv"),
        *(WeightRule(f"self_attention.linear_proj.{p}", (_LAYER + f"attn.attention.out_proj.{p}",))
          for p in ("weight", "bias")),
        *(WeightRule(f"pre_mlp_layernorm.{p}", (_LAYER + f"ln_2.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc1.{p}", (_LAYER + f"mlp.c_fc.{p}",)) for p in ("weight", "bias")),
        *(WeightRule(f"mlp.linear_fc2.{p}", (_LAYER + f"mlp.c_proj.{p}",)) for p in ("weight", "bias")),
    ),
    final_norm=(),
    head=(
        *(WeightRule(f"final_layernorm.{p}", (f"transformer.ln_f.{p}",)) for p in ("weight", "bias")),
        WeightRule("output_layer.weight", ("lm_head.weight",), "vocab"),
    ),
)

FAMILY = Family("gpt-neo", ("gpt_neo",), from_hf, to_hf, WEIGHTS)
