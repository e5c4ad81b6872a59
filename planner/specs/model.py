"""Decoder-only transformer models, described layer by layer.

A model is a list of layers the way a pipeline sees it: the embedding, the
transformer blocks, (for LLaMA) a separate final norm, and the LM head with
the loss. Sailor's published profiles number layers the same way (OPT-350 is
26 layers: embedding, 24 blocks, head), so a plan's layer ranges mean the same
thing in both worlds.

For every layer we know, as pure functions of the tensor-parallel degree `tp`:
  * parameters held by one GPU of the TP group,
  * activation floats kept for backward, per token of one sample,
  * output floats per token (what a pipeline stage sends to the next),
  * forward FLOPs per token (backward is counted as 2x forward).

Megatron layout: QKV/fc1 are column-parallel, proj/fc2 row-parallel (their
biases and the norms are replicated), the vocabulary is padded to a multiple of
128*tp and split across the TP group, learned position embeddings are
replicated. Counted this way, parameters match Sailor's llm_info.json exactly
for OPT-350, OPT-30 and GPT-Neo-2.7 at every TP degree.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from planner.errors import SailorError

EMBEDDING, BLOCK, FINAL_NORM, HEAD = "embedding", "block", "final_norm", "head"


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer (validated on construction)."""

    name: str
    family: str  # opt | gpt2 | gpt-neo | llama
    hidden: int
    num_blocks: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    kv_heads: int = 0  # 0 means multi-head attention (kv_heads == heads)
    tied_embeddings: bool = False
    gated_mlp: bool = False  # SwiGLU MLP (LLaMA) instead of GELU
    rms_norm: bool = False  # RMSNorm has no bias
    learned_positions: bool = True
    bias: bool = True
    separate_final_norm: bool = False  # LLaMA: the final norm is its own layer
    vocab_divisor: int = 128  # Megatron's --make-vocab-size-divisible-by

    def __post_init__(self):
        for field in ("hidden", "num_blocks", "heads", "ffn_hidden", "vocab", "seq_len"):
            if getattr(self, field) <= 0:
                raise SailorError(f"model {self.name!r}: {field} must be positive")
        if self.hidden % self.heads:
            raise SailorError(
                f"model {self.name!r}: hidden size {self.hidden} is not divisible by {self.heads} heads"
            )
        if self.kv_heads and self.heads % self.kv_heads:
            raise SailorError(f"model {self.name!r}: {self.heads} heads not divisible by kv_heads {self.kv_heads}")

    # -- shape helpers -------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return (self.kv_heads or self.heads) * self.head_dim

    @property
    def num_layers(self) -> int:
        """Pipeline layers: embedding + blocks (+ final norm) + head."""
        return self.num_blocks + 2 + (1 if self.separate_final_norm else 0)

    def kind(self, layer: int) -> str:
        if layer == 0:
            return EMBEDDING
        if layer <= self.num_blocks:
            return BLOCK
        if self.separate_final_norm and layer == self.num_blocks + 1:
            return FINAL_NORM
        return HEAD

    def padded_vocab(self, tp: int) -> int:
        """Megatron pads the vocabulary to a multiple of vocab_divisor * tp."""
        step = self.vocab_divisor * tp
        return math.ceil(self.vocab / step) * step

    def tp_degrees(self, max_tp: int) -> list[int]:
        """TP degrees Megatron can use: powers of two dividing heads (and kv heads)."""
        kv = self.kv_heads or self.heads
        out, t = [], 1
        while t <= max_tp:
            if self.heads % t == 0 and (kv % t == 0 or t % kv == 0) and self.ffn_hidden % t == 0:
                out.append(t)
            t *= 2
        return out

    # -- per-layer facts -----------------------------------------------------
    def _block_matmul_weights(self) -> int:
        """Weights of the four matmuls of a block: QKV, proj, fc1 (gate+up), fc2."""
        h = self.hidden
        mlp_in = (2 if self.gated_mlp else 1) * self.ffn_hidden
        return h * (h + 2 * self.kv_dim) + h * h + h * mlp_in + self.ffn_hidden * h

    def _norm_params(self) -> int:
        return self.hidden if self.rms_norm else 2 * self.hidden

    def params(self, layer: int, tp: int = 1) -> int:
        """Parameters one GPU of a TP group holds for `layer`."""
        h, kind = self.hidden, self.kind(layer)
        if kind == EMBEDDING:
            positions = self.seq_len * h if self.learned_positions else 0
            return self.padded_vocab(tp) // tp * h + positions
        if kind == FINAL_NORM:
            return self._norm_params()
        if kind == HEAD:
            own_norm = 0 if self.separate_final_norm else self._norm_params()
            if self.tied_embeddings:
                return own_norm  # the head reuses the embedding matrix
            return self.padded_vocab(tp) // tp * h + own_norm
        # transformer block
        sharded, replicated = self._block_matmul_weights(), 2 * self._norm_params()
        if self.bias:
            sharded += (h + 2 * self.kv_dim) + (2 if self.gated_mlp else 1) * self.ffn_hidden  # column-parallel
            replicated += 2 * h  # row-parallel biases are replicated
        return sharded // tp + replicated

    def total_params(self) -> int:
        return sum(self.params(layer, 1) for layer in range(self.num_layers))

    def activation_floats(self, layer: int, tp: int = 1) -> float:
        """Floats per token that the forward pass keeps for backward (one sample).

        Block: 3h replicated (norm inputs, residual) + (q,k,v + context + MLP
        intermediate)/tp + heads*seq/tp (softmax probabilities; no flash
        attention). This reproduces Sailor's measured llm_info for OPT-350 at
        TP 1, 2, 4 and 8. Head: the logits and their softmax, 2*V/tp, plus the
        final norm's input.
        """
        h, kind = self.hidden, self.kind(layer)
        if kind == EMBEDDING:
            return float(h)
        if kind == FINAL_NORM:
            return float(h)
        if kind == HEAD:
            return 2.0 * self.padded_vocab(tp) / tp + 1.25 * h
        mlp = (2 if self.gated_mlp else 1) * self.ffn_hidden
        sharded = (h + 2 * self.kv_dim) + h + mlp + self.heads * self.seq_len
        return 3.0 * h + sharded / tp

    def output_floats(self, layer: int) -> int:
        """Floats per token a layer hands to the next one (the p2p payload)."""
        return 1 if self.kind(layer) == HEAD else self.hidden

    def forward_flops(self, layer: int) -> float:
        """Forward FLOPs per token of the whole layer (all TP ranks together)."""
        h, kind = self.hidden, self.kind(layer)
        if kind == BLOCK:
            return 2.0 * self._block_matmul_weights() + 4.0 * self.seq_len * h  # + QK^T and AV
        if kind == HEAD:
            return 2.0 * h * self.padded_vocab(1)
        return 0.0


# -- presets ------------------------------------------------------------------
# OPT and GPT-Neo shapes follow their Hugging Face configs, with the choices of
# the Megatron runs behind Sailor's published profiles (sequence 2048, untied
# OPT head). `tiny` is for CPU tests.
_PRESETS = {
    "tiny": ModelSpec("tiny", "opt", hidden=64, num_blocks=4, heads=4, ffn_hidden=256, vocab=512, seq_len=64),
    "opt-125m": ModelSpec("opt-125m", "opt", 768, 12, 12, 3072, 50272, 2048),
    "opt-350m": ModelSpec("opt-350m", "opt", 1024, 24, 16, 4096, 50272, 2048),
    "opt-1.3b": ModelSpec("opt-1.3b", "opt", 2048, 24, 32, 8192, 50272, 2048),
    "opt-6.7b": ModelSpec("opt-6.7b", "opt", 4096, 32, 32, 16384, 50272, 2048),
    "opt-30b": ModelSpec("opt-30b", "opt", 7168, 48, 56, 28672, 50272, 2048),
    "gpt2": ModelSpec("gpt2", "gpt2", 768, 12, 12, 3072, 50257, 1024, tied_embeddings=True),
    "gpt-neo-2.7b": ModelSpec("gpt-neo-2.7b", "gpt-neo", 2560, 32, 20, 10240, 50257, 2048, tied_embeddings=True),
    "llama-3-8b": ModelSpec(
        "llama-3-8b", "llama", 4096, 32, 32, 14336, 128256, 8192, kv_heads=8, gated_mlp=True,
        rms_norm=True, learned_positions=False, bias=False, separate_final_norm=True,
    ),
}
# Sailor's names for the same models (its profiles and plans use these).
ALIASES = {
    "OPT-350": "opt-350m",
    "OPT-30": "opt-30b",
    "GPT-Neo-2.7": "gpt-neo-2.7b",
    "LLAMA-3-8": "llama-3-8b",
    "opt-350": "opt-350m",
    "opt-30": "opt-30b",
    "gpt-neo-2.7": "gpt-neo-2.7b",
    "llama-3-8": "llama-3-8b",
}
SAILOR_NAMES = {v: k for k, v in ALIASES.items() if k.isupper() or k[0].isupper()}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def canonical_name(name: str) -> str:
    return ALIASES.get(name, ALIASES.get(name.upper(), name.lower() if name.lower() in _PRESETS else name))


def get_model(name_or_path: str, seq_len: int | None = None) -> ModelSpec:
    """A preset by name or alias, or a Hugging Face style config.json."""
    key = canonical_name(name_or_path)
    if key in _PRESETS:
        model = _PRESETS[key]
    elif name_or_path.endswith(".json") or Path(name_or_path).is_dir():
        model = from_hf_config(name_or_path)
    else:
        raise SailorError(
            f"unknown model {name_or_path!r}: use one of {', '.join(preset_names())} "
            "(or Sailor's OPT-350, GPT-Neo-2.7, LLAMA-3-8, OPT-30), or a path to a config.json"
        )
    return replace(model, seq_len=seq_len) if seq_len else model


def from_hf_config(path: str) -> ModelSpec:
    """Read a Hugging Face `config.json` (OPT, GPT-2, GPT-Neo, LLaMA/Mistral)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise SailorError(f"model config {p} not found: give a preset name or an existing config.json") from None
    except json.JSONDecodeError as e:
        raise SailorError(f"model config {p} is not valid JSON ({e.msg} at line {e.lineno})") from None
    kind = cfg.get("model_type", "")
    name = cfg.get("_name_or_path") or p.parent.name or p.stem
    try:
        if kind == "opt":
            return ModelSpec(name, "opt", cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                             cfg["ffn_dim"], cfg["vocab_size"], cfg["max_position_embeddings"])
        if kind == "gpt2":
            h = cfg["n_embd"]
            return ModelSpec(name, "gpt2", h, cfg["n_layer"], cfg["n_head"], cfg.get("n_inner") or 4 * h,
                             cfg["vocab_size"], cfg["n_positions"], tied_embeddings=True)
        if kind == "gpt_neo":
            h = cfg["hidden_size"]
            return ModelSpec(name, "gpt-neo", h, cfg["num_layers"], cfg["num_heads"],
                             cfg.get("intermediate_size") or 4 * h, cfg["vocab_size"],
                             cfg["max_position_embeddings"], tied_embeddings=True)
        if kind in ("llama", "mistral", "qwen2"):
            return ModelSpec(name, "llama", cfg["hidden_size"], cfg["num_hidden_layers"],
                             cfg["num_attention_heads"], cfg["intermediate_size"], cfg["vocab_size"],
                             cfg["max_position_embeddings"], kv_heads=cfg.get("num_key_value_heads", 0) or 0,
                             tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), gated_mlp=True,
                             rms_norm=True, learned_positions=False, bias=False, separate_final_norm=True)
    except KeyError as e:
        raise SailorError(f"model config {p}: missing field {e.args[0]!r} for model_type {kind!r}") from None
    raise SailorError(
        f"model config {p}: model_type {kind!r} is not supported; use opt, gpt2, gpt_neo, llama or mistral"
    )
