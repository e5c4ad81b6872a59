"""Hugging Face weights in and out: safetensors files <-> our logical tensors.

Our logical tensors (`layers.<L>.<module path>`, sharding.py) are what a
single-GPU run of our model holds; a Hugging Face checkpoint names and lays
them out its own way. The family's WeightMap (planner/specs/families) says,
tensor by tensor, which Hugging Face tensors make a logical tensor and how
(`WeightRule.op`); this module applies those conversions, both ways:

  * `HFWeights(dir)` reads `model.safetensors` or a sharded checkpoint
    (`model.safetensors.index.json`), lazily, tensor by tensor, dequantizing MXFP4
    tensors (gpt-oss's published experts) and block-scaled FP8 ones (DeepSeek-V3's, Kimi K2's);
  * `load_stage(stage, dir)` gives every parameter of a stage (its fp32 main
    parameter in bf16/fp16 runs) its slice of the converted tensor, reading
    only that slice from disk (`--load-hf`: any plan, any TP degree);
  * `export(logical, model, out_dir)` writes safetensors + config.json that
    `transformers.AutoModelForCausalLM.from_pretrained` loads.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from planner.errors import SailorError
from planner.inputs import short
from planner.specs.families import WeightRule, family, from_hf_config, to_hf_config
from planner.specs.model import BLOCK, EMBEDDING, FINAL_NORM, HEAD, ModelSpec

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 2**30  # transformers' default shard size


# -- naming -------------------------------------------------------------------------
def _rules(model: ModelSpec, kind: str) -> tuple[WeightRule, ...]:
    weights = family(model.family).weights
    return {EMBEDDING: weights.embedding, BLOCK: weights.block, FINAL_NORM: weights.final_norm,
            HEAD: weights.head}[kind]


def rule_for(model: ModelSpec, logical: str) -> tuple[WeightRule, int]:
    """The rule that makes logical tensor `layers.<L>.<path>`, and the block index for `{i}`."""
    _, layer, path = logical.split(".", 2)
    layer = int(layer)
    kind = model.kind(layer)
    dense = kind == BLOCK and (model.dense(layer - 1) or not model.experts)  # (a model without experts: dense)
    for rule in _rules(model, kind):
        if rule.ours == path and rule.blocks in ("", "dense" if dense else "sparse"):
            return rule, layer - 1
    raise SailorError(f"the {model.family} family has no Hugging Face name for {logical}; "
                      "this model cannot be converted")


def hf_names(rule: WeightRule, block: int, model: ModelSpec) -> tuple[str, ...]:
    """The rule's Hugging Face names in block `block`; rules of expert tensors ({e} in their names)
    name every expert's, expert by expert, and rules of per-head tensors every query head's ({h}) or key/value
    head's ({g})."""
    for key, count in (("e", model.experts), ("h", model.heads), ("g", model.num_query_groups)):
        if any("{" + key + "}" in name for name in rule.hf):
            return tuple(name.format(i=block, **{key: n}) for n in range(count) for name in rule.hf)
    return tuple(name.format(i=block) for name in rule.hf)


# -- layout conversions (one per WeightRule.op) -------------------------------------------
def _group_qkv(*parts: torch.Tensor, groups: int) -> torch.Tensor:
    """[q; k; v] rows of `groups` query groups -> megatron's rows [q_g, k_g, v_g] for each group g (any parts:
    [q_g, gate_g, k_g, v_g] with an output gate, Gated DeltaNet's [q_g, k_g, v_g] per key head)."""
    rest = parts[0].shape[1:]
    return torch.cat([p.reshape(groups, -1, *rest) for p in parts], dim=1).reshape(-1, *rest)


def _ungroup(fused: torch.Tensor, groups: int, widths: list[int]) -> list[torch.Tensor]:
    """_group_qkv undone: the parts' rows, of `widths` rows per group each."""
    rest = fused.shape[1:]
    return [part.reshape(-1, *rest) for part in fused.reshape(groups, -1, *rest).split(widths, dim=1)]


def _qkv_widths(model: ModelSpec) -> list[int]:
    """Rows per query group of megatron's fused QKV: q (and the output gate's), k, v."""
    q, d = model.q_dim // model.num_query_groups, model.head_dim
    return [q, q, d, d] if model.attention_gate else [q, d, d]


def _ungroup_qkv(model: ModelSpec, fused: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(_ungroup(fused, model.num_query_groups, _qkv_widths(model)))


def _delta_widths(model: ModelSpec) -> list[int]:
    """Rows per key head of Gated DeltaNet's [q; k; v] as we keep it (sailor_ext.linear_attention)."""
    dk = model.linear_key_dim
    return [dk, dk, model.linear_v_dim // model.linear_key_heads]


# Qwen3-Next keeps Gated DeltaNet's projections in two tensors grouped by key head, [q_g, k_g, v_g, z_g] and
# [b_g, a_g]: each of our tensors is a span of rows of every group of one of them (rows per group: before it, its
# own). Exported, the tensors of one Hugging Face name are added together, each written into zeros.
def _group_spans(model: ModelSpec) -> dict[str, tuple[int, int, int]]:
    """op -> (rows per group of the Hugging Face tensor, rows of the group before ours, our rows per group)."""
    dk, per_value = model.linear_key_dim, model.linear_value_heads // model.linear_key_heads
    qkv, v = 2 * dk + per_value * model.linear_value_dim, per_value * model.linear_value_dim
    return {"qkvz_qkv": (qkv + v, 0, qkv), "qkvz_z": (qkv + v, qkv, v), "ba_b": (2 * per_value, 0, per_value),
            "ba_a": (2 * per_value, per_value, per_value)}


GROUP_SPAN_OPS = ("qkvz_qkv", "qkvz_z", "ba_b", "ba_a")


def to_hf(model: ModelSpec, rule: WeightRule, tensor: torch.Tensor) -> list[torch.Tensor]:
    """The rule's Hugging Face tensors from our logical tensor (also on the meta device: their shapes)."""
    op = rule.op
    if op == "copy":
        return [tensor]
    if op == "row":
        return [tensor[None]]
    if op == "t":
        return [tensor.t()]
    if op == "vocab":
        return [tensor[: model.vocab]]
    if op == "qkv":
        return list(_ungroup_qkv(model, tensor))
    if op in ("qkv_cat", "qkv_cat_t"):
        fused = torch.cat(_ungroup_qkv(model, tensor), dim=0)
        return [fused.t() if op == "qkv_cat_t" else fused]
    if op == "qkv_gated":  # q_proj holds each head's [q; gate] (Qwen3.5)
        q, gate, k, v = _ungroup_qkv(model, tensor)
        rest = q.shape[1:]
        return [torch.stack([q.reshape(model.heads, -1, *rest), gate.reshape(model.heads, -1, *rest)], dim=1)
                .reshape(-1, *rest), k, v]
    if op == "delta_qkv":
        return [torch.cat(_ungroup(tensor, model.linear_key_heads, _delta_widths(model)), dim=0)]
    if op in GROUP_SPAN_OPS:
        width, before, ours = _group_spans(model)[op]
        groups, rest = model.linear_key_heads, tensor.shape[1:]
        full = tensor.new_zeros(groups, width, *rest)
        full[:, before:before + ours] = tensor.reshape(groups, ours, *rest)
        return [full.reshape(-1, *rest)]
    if op == "gate_up":
        return list(tensor.unbind(0))
    if op == "gate_up_cat":
        return [tensor.reshape(-1, *tensor.shape[2:])]
    if op in ("experts", "heads"):  # [E, ...] -> one tensor per expert ([heads, ...] -> one per head)
        return list(tensor.unbind(0))
    if op == "experts_gate_up":  # [E, 2, ffn, h] -> each expert's gate and up
        return [part for expert in tensor.unbind(0) for part in expert.unbind(0)]
    if op == "experts_gate_up_cat":  # [E, 2, ffn, h] -> [E, 2 ffn, h]
        return [tensor.flatten(1, 2)]
    if op == "experts_t":  # [E, out, in] -> [E, in, out]
        return [tensor.transpose(1, 2)]
    if op == "experts_gate_up_t":  # [E, 2, ffn, h] -> [E, h, 2 ffn]: the gate's columns, then up's
        return [tensor.flatten(1, 2).transpose(1, 2)]
    if op == "experts_gate_up_alternating":  # [E, 2, ffn, h] -> [E, h, 2 ffn]: column 2j gate row j, 2j + 1 up's
        return [tensor.movedim(1, -1).movedim(1, -2).flatten(-2) if tensor.dim() == 4 else  # (the weight)
                tensor.movedim(1, -1).flatten(-2)]  # the bias [E, 2, ffn] -> [E, 2 ffn]
    raise ValueError(f"unknown weight op {op!r}")


def local_slice(weights: "HFWeights", model: ModelSpec, rule: WeightRule, names: tuple[str, ...],
                shard) -> torch.Tensor:
    """This rank's slice (shard.local_shape, our layout) of a logical tensor, reading from the
    Hugging Face tensors only the rows or columns it needs."""
    expected = [tuple(t.shape) for t in to_hf(model, rule, torch.empty(shard.logical_shape, device="meta"))]
    given = [weights.shape(n) for n in names]
    if given != expected:
        found = ", ".join(f"{n} {g}" for n, g in zip(names, given))
        raise SailorError(f"Hugging Face weights do not match the model: {found} cannot make {rule.ours} of shape "
                          f"{tuple(shard.logical_shape)} (expected {', '.join(map(str, expected))}); load weights "
                          "saved for this config")
    op, dim = rule.op, shard.dim
    start, stop = shard.local_range() if dim is not None else (None, None)
    if op == "copy":
        out = weights.get(names[0], dim, start, stop)
    elif op == "row":  # [1, n] -> [n], replicated
        out = weights.get(names[0])[0]
    elif op == "t":
        out = weights.get(names[0], None if dim is None else 1 - dim, start, stop).t()
    elif op == "vocab":  # rows beyond the vocabulary are the runtime's padding: zeros
        lo, hi = (0, shard.logical_shape[0]) if dim is None else (start, stop)
        out = torch.zeros((hi - lo, *shard.logical_shape[1:]))
        if lo < model.vocab:
            out[: min(hi, model.vocab) - lo] = weights.get(names[0], 0, lo, min(hi, model.vocab))
    elif op == "gate_up":  # logical [2, ffn, ...], split along the ffn rows
        lo, hi = (None, None) if dim is None else (start, stop)
        out = torch.stack([weights.get(n, None if dim is None else 0, lo, hi) for n in names])
    elif op == "gate_up_cat":  # the same, from one tensor [gate; up]: gate rows lo..hi, then up rows ffn + lo..hi
        ffn = shard.logical_shape[1]
        lo, hi = (0, ffn) if dim is None else (start, stop)
        out = torch.stack([weights.get(names[0], 0, o + lo, o + hi) for o in (0, ffn)])
    elif op == "heads":  # logical [heads, ...] split along the heads: this rank's heads' tensors
        out = torch.stack([weights.get(n) for n in (names if dim is None else names[start:stop])])
    elif op == "experts":  # logical [E, ...], each expert's tensor sliced along the same dimension
        out = torch.stack([weights.get(n, None if dim is None else dim - 1, start, stop) for n in names])
    elif op == "experts_gate_up":  # logical [E, 2, ffn, h] split along ffn: each expert's gate and up rows
        rows = (None, None, None) if dim is None else (0, start, stop)
        out = torch.stack([weights.get(n, *rows) for n in names]).reshape(-1, 2, *shard.local_shape[2:])
    elif op == "experts_gate_up_cat":  # logical [E, 2, ffn, h] split along ffn: gate rows lo..hi, up rows ffn + lo..hi
        ffn = shard.logical_shape[2]
        lo, hi = (0, ffn) if dim is None else (start, stop)
        out = torch.stack([weights.get(names[0], 1, o + lo, o + hi) for o in (0, ffn)], dim=1)
    elif op == "experts_gate_up_t":  # logical [E, 2, ffn, h] split along ffn: columns lo..hi and ffn + lo..hi
        ffn = shard.logical_shape[2]
        lo, hi = (0, ffn) if dim is None else (start, stop)
        out = torch.stack([weights.get(names[0], 2, o + lo, o + hi) for o in (0, ffn)], dim=1).transpose(2, 3)
    elif op == "experts_t":  # logical [E, out, in] split along `in` (dim 2): the columns of [E, in, out]
        out = weights.get(names[0], None if dim is None else 1, start, stop).transpose(1, 2)
    elif op == "experts_gate_up_alternating":  # logical [E, 2, ffn(, h)] split along ffn: columns 2 lo .. 2 hi
        axis = len(shard.logical_shape) - 2  # the last of [E, h, 2 ffn] or [E, 2 ffn]
        part = weights.get(names[0], None if dim is None else axis, None if dim is None else 2 * start,
                           None if dim is None else 2 * stop)
        pairs = part.unflatten(-1, (-1, 2))  # [E(, h), ffn, 2]
        out = pairs.movedim(-1, 1) if part.dim() == 2 else pairs.movedim(-1, 1).movedim(-1, 2)
    elif op in ("qkv", "qkv_cat", "qkv_cat_t"):
        per_group = (model.heads // model.num_query_groups + 2) * model.head_dim  # fused rows of one group
        g0, g1 = (0, model.num_query_groups) if dim is None else (start // per_group, stop // per_group)
        q_rows, kv_rows = model.q_dim // model.num_query_groups, model.head_dim
        spans = [(g0 * q_rows, g1 * q_rows), (g0 * kv_rows, g1 * kv_rows), (g0 * kv_rows, g1 * kv_rows)]
        if op == "qkv":
            parts = [weights.get(n, 0, lo, hi) for n, (lo, hi) in zip(names, spans)]
        else:  # q, k and v stacked in one tensor: its rows (columns of GPT-2's Conv1D weight)
            offsets = (0, model.q_dim, model.q_dim + model.kv_dim)
            axis = 1 if op == "qkv_cat_t" else 0
            parts = [weights.get(names[0], axis, o + lo, o + hi) for o, (lo, hi) in zip(offsets, spans)]
            parts = [p.t() for p in parts] if op == "qkv_cat_t" else parts
        out = _group_qkv(*parts, groups=g1 - g0)
    elif op == "qkv_gated":  # q_proj's rows [heads, 2 (q, gate), head_dim], k_proj, v_proj -> [q_g, gate_g, k_g, v_g]
        widths = _qkv_widths(model)
        g0, g1 = (0, model.num_query_groups) if dim is None else (start // sum(widths), stop // sum(widths))
        q_rows, kv_rows = 2 * widths[0], widths[2]
        paired = weights.get(names[0], 0, g0 * q_rows, g1 * q_rows)
        paired = paired.reshape(-1, 2, model.head_dim, *paired.shape[1:])
        k, v = (weights.get(n, 0, g0 * kv_rows, g1 * kv_rows) for n in names[1:])
        q, gate = (paired[:, i].reshape(-1, *paired.shape[3:]) for i in (0, 1))
        out = _group_qkv(q, gate, k, v, groups=g1 - g0)
    elif op in GROUP_SPAN_OPS:  # our span of rows of each group, for the groups of this rank's rows
        width, before, ours = _group_spans(model)[op]
        g0, g1 = (0, model.linear_key_heads) if dim is None else (start // ours, stop // ours)
        rows = weights.get(names[0], 0, g0 * width, g1 * width)
        out = rows.reshape(g1 - g0, width, *rows.shape[1:])[:, before:before + ours]
    elif op == "delta_qkv":  # transformers' [q; k; v] rows -> ours grouped by key head
        widths = _delta_widths(model)
        g0, g1 = (0, model.linear_key_heads) if dim is None else (start // sum(widths), stop // sum(widths))
        offsets = (0, model.linear_k_dim, 2 * model.linear_k_dim)
        out = _group_qkv(*(weights.get(names[0], 0, o + g0 * w, o + g1 * w) for o, w in zip(offsets, widths)),
                         groups=g1 - g0)
    else:
        raise ValueError(f"unknown weight op {op!r}")
    return out.reshape(shard.local_shape)


# -- reading ----------------------------------------------------------------------
# MXFP4 (the OCP microscaling format gpt-oss's experts are published in): groups of 32 values share a
# power-of-two scale 2^(s - 127), s one byte; each value is a 4-bit E2M1 code, two per byte, the low nibble first
MXFP4_GROUP = 32
MXFP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks [..., G, 16] and scales [..., G] (uint8) -> the values [..., G * 32], fp32 (exact: an E2M1 value
    times a power of two). Expert by expert (the leading dimension), to bound the int64 codes in memory."""
    if blocks.dim() > 3 and len(blocks):
        return torch.stack([dequantize_mxfp4(b, s) for b, s in zip(blocks, scales)])
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()  # [..., G, 32]
    values = torch.tensor(MXFP4_VALUES)[codes]
    return torch.ldexp(values, scales.int().sub(127).unsqueeze(-1)).flatten(-2)


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_BLOCK = (128, 128)  # transformers' FineGrainedFP8Config.weight_block_size when config.json gives none


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                   offset: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """A block-scaled FP8 matrix in fp32: weight [R, C] (float8) times the scale of the block [r // b0, c // b1]
    that holds each element (DeepSeek's weight_dequant; the last blocks of a dimension may be partial).
    scale_inv holds the blocks from those of weight[0, 0] on, which sits at `offset` of the whole matrix."""
    scales = scale_inv.float().repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    rows, cols = offset[0] % block[0], offset[1] % block[1]
    return weight.float() * scales[rows:rows + weight.shape[0], cols:cols + weight.shape[1]]


# where a multimodal checkpoint keeps its language model's tensors -> a causal language model's names: transformers 5
# saves them as model.language_model.*; Gemma 3's and Mistral 3's published checkpoints (transformers 4) as
# language_model.model.* and language_model.lm_head.*
LANGUAGE_MODEL = {"model.language_model.": "model.", "language_model.model.": "model.",
                  "language_model.lm_head.": "lm_head."}


class HFWeights:
    """The tensors of a Hugging Face checkpoint directory, opened lazily."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index, single = self.directory / INDEX_FILE, self.directory / SINGLE_FILE
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError, OSError, RecursionError):  # (OSError: a directory, unreadable)
                raise SailorError(f"{index} is not a safetensors index (no weight_map)") from None
            if not isinstance(weight_map, dict) or not all(
                    isinstance(f, str) and f.endswith(".safetensors") and "/" not in f and f not in (".", "..")
                    for f in weight_map.values()):
                raise SailorError(f"{index}: weight_map must map tensor names to .safetensors files in {self.directory}"
                                  " (as transformers' save_pretrained writes it)")
            self.files = {name: self.directory / file for name, file in weight_map.items()}
        elif single.exists():
            with self._open(single) as f:
                self.files = dict.fromkeys(f.keys(), single)
        else:
            raise SailorError(f"no Hugging Face weights in {self.directory}: expected {SINGLE_FILE} or {INDEX_FILE} "
                              "(safetensors; convert .bin checkpoints with transformers' save_pretrained)")
        # a multimodal checkpoint's language model, read by a causal language model's names (the vision tower's
        # tensors are not read)
        self.stored = {ours + n.removeprefix(prefix): n for n in self.files
                       for prefix, ours in LANGUAGE_MODEL.items() if n.startswith(prefix)}
        self.files.update({name: self.files[n] for name, n in self.stored.items()})
        self._handles: dict[Path, object] = {}

    @staticmethod
    def _open(path: Path):
        from safetensors import safe_open

        try:
            return safe_open(str(path), framework="pt")
        except FileNotFoundError:
            raise SailorError(f"{path} is missing (listed in the index)") from None
        except Exception as e:  # safetensors raises its own error types for damaged headers
            raise SailorError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0][:200]})") \
                from None

    def _slice(self, name: str):
        path = self.files.get(name)
        if path is None:
            raise SailorError(f"Hugging Face weights in {self.directory} have no tensor {name}; they were saved "
                              "for another model or config")
        if path not in self._handles:
            self._handles[path] = self._open(path).__enter__()
        try:
            return self._handles[path].get_slice(self.stored.get(name, name))
        except Exception:  # safetensors' own error type: the index names a file that lacks the tensor
            raise SailorError(f"{path} holds no tensor {name}, which {INDEX_FILE} places there; give the "
                              "checkpoint's own index") from None

    def _quantized(self, name: str) -> bool:
        """Whether `name` is stored as MXFP4 (gpt-oss's experts, as transformers quantizes them alone):
        `<name>_blocks` and `<name>_scales`."""
        return ".mlp.experts." in name and name not in self.files and f"{name}_blocks" in self.files and \
            f"{name}_scales" in self.files

    def shape(self, name: str) -> tuple[int, ...]:
        if self._quantized(name):  # blocks [..., R, G, 16] hold the tensor [..., G * 32, R]
            blocks, scales = (tuple(self._slice(f"{name}{suffix}").get_shape()) for suffix in ("_blocks", "_scales"))
            if len(blocks) < 3 or blocks[-1] != MXFP4_GROUP // 2 or scales != blocks[:-1]:
                raise SailorError(f"Hugging Face weights in {self.directory}: {name}_blocks {blocks} and "
                                  f"{name}_scales {scales} are not MXFP4 (blocks [..., rows, groups, 16], scales "
                                  "[..., rows, groups]); give the model's own weights")
            *lead, rows, groups, _ = blocks
            return (*lead, groups * MXFP4_GROUP, rows)
        return tuple(self._slice(name).get_shape())

    def _read(self, name: str, dim: int | None, start: int | None, stop: int | None) -> torch.Tensor:
        """Tensor `name` as stored, or only [start, stop) along `dim`, read from disk alone."""
        view = self._slice(name)
        return view[...] if dim is None else view[(slice(None),) * dim + (slice(start, stop),)]  # (... reads 0-dim too)

    def get(self, name: str, dim: int | None = None, start: int | None = None, stop: int | None = None) \
            -> torch.Tensor:
        """Tensor `name` in fp32, or only [start, stop) along `dim`, read from disk alone (MXFP4 tensors:
        only the blocks that hold it, dequantized; FP8 ones with the scales of their blocks)."""
        if self._quantized(name):
            return self._dequantized(name, dim, start, stop)
        tensor = self._read(name, dim, start, stop)
        if tensor.dtype in FP8_DTYPES:
            return self._fp8(name, tensor, dim, start)
        if not tensor.is_floating_point():  # integers would load as weights and train to NaN
            raise SailorError(f"Hugging Face weights in {self.directory}: {name} holds {tensor.dtype} values, not "
                              "floating-point weights; give a model's safetensors weights")
        return tensor.float()

    def _dequantized(self, name: str, dim: int | None, start: int | None, stop: int | None) -> torch.Tensor:
        """[start, stop) along `dim` of the MXFP4 tensor `name` [..., C, R], from the blocks [..., R, C / 32, 16]
        and scales [..., R, C / 32] of the groups that hold it."""
        shape = self.shape(name)
        at, trim = dim, None
        if dim == len(shape) - 1:  # R: rows of the blocks
            at = dim - 1
        elif dim == len(shape) - 2:  # C: the groups of 32 that hold [start, stop), then those values alone
            at, first = dim + 1, start // MXFP4_GROUP
            trim = slice(start - first * MXFP4_GROUP, stop - first * MXFP4_GROUP)
            start, stop = first, -(-stop // MXFP4_GROUP)
        blocks, scales = (self._read(f"{name}{suffix}", at, start, stop) for suffix in ("_blocks", "_scales"))
        if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
            raise SailorError(f"Hugging Face weights in {self.directory}: {name}_blocks and {name}_scales hold "
                              f"{blocks.dtype} and {scales.dtype}, not MXFP4's bytes (uint8); give the model's own "
                              "weights")
        if (scales == 255).any():  # (the format's NaN)
            raise SailorError(f"Hugging Face weights in {self.directory}: {name}_scales holds 255, MXFP4's NaN; give "
                              "the model's own weights")
        tensor = dequantize_mxfp4(blocks, scales)
        if trim is not None:
            tensor = tensor[..., trim]
        return tensor.transpose(-1, -2)

    def _fp8(self, name: str, tensor: torch.Tensor, dim: int | None, start: int | None) -> torch.Tensor:
        """The FP8 tensor `name` [R, C] (or its [start, ...) along `dim`, read as `tensor`) times the scales of its
        blocks, `<name>_scale_inv` [ceil(R / b0), ceil(C / b1)] (b: config.json's weight_block_size)."""
        scale = f"{name}_scale_inv"
        shape = self.shape(name)
        block = self._fp8_block
        grid = tuple(-(-n // b) for n, b in zip(shape, block))
        if scale not in self.files or len(shape) != 2 or tuple(self._slice(scale).get_shape()) != grid:
            raise SailorError(f"Hugging Face weights in {self.directory}: {name} holds {tensor.dtype} values without "
                              f"a {scale} of the {grid} blocks of {block[0]} x {block[1]} (config.json's "
                              "quantization_config weight_block_size); give block-scaled FP8 weights (DeepSeek's) or "
                              "unquantized ones")
        offset = [0, 0]
        if dim is None:
            scales = self._read(scale, None, None, None)
        else:
            first = start // block[dim]
            scales = self._read(scale, dim, first, -(-(start + tensor.shape[dim]) // block[dim]))
            offset[dim] = start
        return dequantize_fp8(tensor, scales, block, tuple(offset))

    @functools.cached_property
    def _fp8_block(self) -> tuple[int, int]:
        """config.json's quantization_config weight_block_size [b0, b1], else transformers' default."""
        try:
            quant = json.loads((self.directory / "config.json").read_text()).get("quantization_config") or {}
        except (OSError, ValueError, AttributeError):
            quant = {}
        block = quant.get("weight_block_size") if isinstance(quant, dict) else None
        if block is None:
            return FP8_BLOCK
        if not isinstance(block, list) or len(block) != 2 or \
                not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 20 for b in block):
            raise SailorError(f"{self.directory / 'config.json'}: quantization_config weight_block_size must be two "
                              f"positive integers, not {short(block)}")
        return block[0], block[1]

    def close(self) -> None:
        for handle in self._handles.values():
            handle.__exit__(None, None, None)
        self._handles = {}


def check_config(model: ModelSpec, directory: str | Path) -> None:
    """Refuse weights whose config.json describes another architecture."""
    theirs = from_hf_config(directory, seq_len=model.seq_len)
    if replace(theirs, name="", hf_model_type="") != replace(model, name="", hf_model_type=""):
        ours, other = model.to_dict(), theirs.to_dict()
        diff = next(k for k in ours if ours[k] != other[k] and k not in ("name", "hf_model_type"))
        raise SailorError(f"the Hugging Face model in {directory} has {diff} {other[diff]!r} but the plan's model "
                          f"{model.name} has {ours[diff]!r}; plan with --model {directory}")


HEAD_ROWS = 4096  # rows of the head compared at a time


def check_tied_head(model: ModelSpec, weights: HFWeights) -> None:
    """Refuse a config that ties the output layer to the word embeddings over a checkpoint holding its own,
    different one: the run would drop that head without a word. (transformers unties such a checkpoint; Mistral
    Small 3.1's config, re-saved by transformers 5, says tie_word_embeddings true over its own lm_head.)"""
    rules = family(model.family).weights
    word = next(r.hf[0] for r in rules.embedding if r.ours == "word_embeddings.weight")
    head = next((r.hf[0] for r in rules.head if r.ours == "output_layer.weight"), None)
    if head is None or head not in weights.files:
        return
    rows = weights.shape(head)[0]
    if weights.shape(word) == weights.shape(head) and all(
            torch.equal(weights.get(word, 0, a, min(a + HEAD_ROWS, rows)),
                        weights.get(head, 0, a, min(a + HEAD_ROWS, rows))) for a in range(0, rows, HEAD_ROWS)):
        return
    raise SailorError(f"the Hugging Face weights in {weights.directory} hold their own {head}, unlike {word}, but "
                      "config.json ties the two (tie_word_embeddings); set tie_word_embeddings to false there "
                      "(beside text_config too, if it has one) and plan again")


@torch.no_grad()
def load_stage(stage, directory: str | Path, params: dict[str, torch.Tensor] | None = None) -> None:
    """Give every parameter of `stage` (a StageModel) its slice of the Hugging Face weights.

    params: where to write them by parameter name (the fp32 main parameters of a
    bf16/fp16 run, precision.py); default: the stage's own parameters."""
    model = stage.spec.model
    if (Path(directory) / "config.json").exists():
        check_config(model, directory)
    weights = HFWeights(directory)
    try:
        if model.tied_embeddings and any(name.endswith("word_embeddings.weight") for name in stage.shards):
            check_tied_head(model, weights)
        for name, param in (params or dict(stage.named_parameters())).items():
            shard = stage.shards[name]
            rule, block = rule_for(model, shard.name)
            names = hf_names(rule, block, model)
            shard.view(param).copy_(local_slice(weights, model, rule, names, shard))
    finally:
        weights.close()


# -- writing ----------------------------------------------------------------------
def hf_state_dict(model: ModelSpec, logical: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Hugging Face tensors from our logical tensors (tied weights written once)."""
    out = {}
    for name in sorted(logical):
        rule, block = rule_for(model, name)
        for hf_name, tensor in zip(hf_names(rule, block, model), to_hf(model, rule, logical[name])):
            if rule.op in GROUP_SPAN_OPS and hf_name in out:  # (spans of one tensor, each in its own rows)
                tensor = out[hf_name] + tensor
            out[hf_name] = tensor
    return {name: tensor.to(dtype).contiguous() for name, tensor in out.items()}


def export(logical: dict[str, torch.Tensor], model: ModelSpec, out_dir: str | Path,
           dtype: torch.dtype = torch.float32, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[Path]:
    """Write config.json and safetensors (sharded with an index beyond max_shard_bytes) into out_dir."""
    from safetensors.torch import save_file

    config = to_hf_config(model)
    config["dtype"] = str(dtype).removeprefix("torch.")
    tensors = hf_state_dict(model, logical, dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    names = [SINGLE_FILE] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    written = []
    for file, shard in zip(names, shards):
        written.append(_atomic(out / file, lambda tmp, shard=shard: save_file(shard, str(tmp), {"format": "pt"})))
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": {n: f for f, shard in zip(names, shards) for n in shard}}
        written.append(_atomic(out / INDEX_FILE, lambda tmp: tmp.write_text(json.dumps(index, indent=2) + "\n")))
    written.append(_atomic(out / "config.json", lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n")))
    return written


def _atomic(path: Path, write) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)
    return path
