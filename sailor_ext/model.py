"""A GPT/OPT-style decoder, cut into the plan's stages, on megatron-core layers.

Layers are numbered as in planner's ModelSpec: 0 is the embedding (word +
learned positions, `LanguageModelEmbedding` over a `VocabParallelEmbedding`),
1..n are transformer blocks (`TransformerLayer` from megatron's local spec:
column-parallel QKV/fc1, row-parallel proj/fc2), n+1 is the head (final
LayerNorm + a column-parallel output layer whose logits stay split over the
vocabulary; the loss is computed from them in `loss.py`). Every module gets
its TP group explicitly; megatron's global parallel state is never set up.

Weights are initialised from the seed as full logical tensors, one generator
per logical name, and each rank keeps its slice, so every plan (and the
single-process run) starts from identical weights. Dropout is 0.

A stage with `recompute` runs each block under activation checkpointing: the
forward keeps only the block's input, and backward runs the block's forward
again to rebuild what it needs (less memory per microbatch in flight, one
more forward of compute; dropout 0 makes the rerun exact).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from sailor_ext import compat  # noqa: F401  (installs warning filters before megatron imports)
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from megatron.core.transformer.spec_utils import build_module  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from planner.specs.model import BLOCK, EMBEDDING, HEAD, ModelSpec  # noqa: E402
from sailor_ext.sharding import ParamShard  # noqa: E402

INIT_STD = 0.02
WORD_EMBEDDING = "layers.0.word_embeddings.weight"


@dataclass(frozen=True)
class StageSpec:
    """What one rank builds: a layer range of a model, sharded over a TP group."""

    model: ModelSpec
    first: int  # first layer, inclusive
    last: int  # last layer, inclusive
    tp: int
    tp_rank: int
    padded_vocab: int
    # Stages holding the word embedding; (0, last stage) when the head reuses it.
    embedding_stages: tuple[int, ...] = (0,)
    stage: int = 0
    stage_chunks: int = 1  # finest common chunking of this stage's sharded weights
    embedding_chunks: int = 1  # finest common chunking of the word embedding
    recompute: bool = False  # checkpoint every block: keep its input, rerun its forward in backward

    @property
    def layers(self) -> range:
        return range(self.first, self.last + 1)


def transformer_config(model: ModelSpec, tp: int) -> TransformerConfig:
    """megatron's config for one stage: fp32 params (autocast does bf16), no
    dropout, no fusions that need CUDA extensions, our own initialisation."""
    return TransformerConfig(
        num_layers=model.num_blocks,
        hidden_size=model.hidden,
        num_attention_heads=model.heads,
        ffn_hidden_size=model.ffn_hidden,
        num_query_groups=model.kv_heads or None,
        tensor_model_parallel_size=tp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        add_bias_linear=model.bias,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
        bias_dropout_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
    )


def causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    """megatron's mask convention: True marks a position that may not be attended."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]


class Head(nn.Module):
    """Final LayerNorm and the vocabulary-parallel output layer."""

    def __init__(self, spec: StageSpec, config: TransformerConfig, norm_cls, tp_group, reuse_embedding: bool):
        super().__init__()
        self.final_layernorm = norm_cls(config=config, hidden_size=spec.model.hidden, eps=config.layernorm_epsilon)
        self.output_layer = ColumnParallelLinear(
            spec.model.hidden, spec.padded_vocab, config=config, init_method=None, bias=False,
            gather_output=False, skip_bias_add=False, skip_weight_param_allocation=reuse_embedding,
            tp_group=tp_group)

    def forward(self, hidden: torch.Tensor, embedding_weight: torch.Tensor | None = None) -> torch.Tensor:
        """embedding_weight: the word embedding, when the head reuses it on this stage."""
        logits, _ = self.output_layer(self.final_layernorm(hidden), weight=embedding_weight)
        return logits


class StageModel(nn.Module):
    """The layers of one pipeline stage on one TP rank.

    forward(first stage: tokens [b, s]; others: hidden [s, b, h]) returns the
    hidden state [s, b, h], or on the last stage the logits [s, b, V/tp].
    """

    def __init__(self, spec: StageSpec, tp_group: dist.ProcessGroup, device: torch.device):
        super().__init__()
        self.spec = spec
        self.tp_group = tp_group
        model = spec.model
        config = transformer_config(model, spec.tp)
        layer_spec = get_gpt_layer_local_spec()
        pg = ProcessGroupCollection(tp=tp_group, pp=None, cp=None)  # our schedule does PP; no CP
        self.layers = nn.ModuleDict()
        for layer in spec.layers:
            kind = model.kind(layer)
            if kind == EMBEDDING:
                self.layers[str(layer)] = LanguageModelEmbedding(
                    config, spec.padded_vocab, model.seq_len, position_embedding_type="learned_absolute",
                    tp_group=tp_group)
            elif kind == BLOCK:
                self.layers[str(layer)] = build_module(layer_spec, config=config, layer_number=layer,
                                                       pg_collection=pg)
            elif kind == HEAD:
                reuse = model.tied_embeddings and "0" in self.layers
                self.layers[str(layer)] = Head(spec, config, layer_spec.submodules.input_layernorm, tp_group, reuse)
            else:
                raise ValueError(f"layer kind {kind} is not supported by the runtime")
        self.shards = self._shards()
        self.to(device)
        self.register_buffer("mask", causal_mask(model.seq_len, device), persistent=False)

    @property
    def vocab_start(self) -> int:
        return self.spec.padded_vocab // self.spec.tp * self.spec.tp_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for key, layer in self.layers.items():
            if isinstance(layer, LanguageModelEmbedding):
                positions = torch.arange(x.size(1), device=x.device).unsqueeze(0)
                x = layer(x, positions)
            elif isinstance(layer, Head):
                reused = self.layers["0"].word_embeddings.weight if layer.output_layer.weight is None else None
                x = layer(x, reused)
            else:
                mask = self.mask[..., : x.size(0), : x.size(0)]
                if self.spec.recompute and torch.is_grad_enabled():
                    x = checkpoint(_block_output, layer, x, mask, use_reentrant=False)
                else:
                    x = _block_output(layer, x, mask)
        return x

    # -- logical tensors ---------------------------------------------------------
    def _shards(self) -> dict[str, ParamShard]:
        """ParamShard of every local parameter, from the megatron module types."""
        spec, out = self.spec, {}
        for module_name, module in self.named_modules():
            for pname, param in module.named_parameters(recurse=False):
                name = f"{module_name}.{pname}"
                dim = None
                if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
                    dim = 0  # output features / vocabulary rows (weight and bias)
                elif isinstance(module, RowParallelLinear) and pname == "weight":
                    dim = 1  # input features; the bias is added after the all-reduce
                logical, stages, chunks = name, (spec.stage,), spec.stage_chunks
                is_word = isinstance(module, VocabParallelEmbedding) or module_name.endswith("output_layer")
                if is_word and spec.model.tied_embeddings:
                    # one logical tensor, held by the first and the last stage
                    logical, stages, chunks = WORD_EMBEDDING, spec.embedding_stages, spec.embedding_chunks
                shape = list(param.shape)
                if dim is not None:
                    shape[dim] *= spec.tp
                out[name] = ParamShard(logical, tuple(shape), dim, spec.tp, spec.tp_rank,
                                       chunks if dim is not None else 1, stages)
        return out


def _block_output(layer: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return layer(x, attention_mask=mask)[0]


def init_tensor(name: str, shape: tuple[int, ...], seed: int, num_blocks: int) -> torch.Tensor:
    """The full logical tensor `name`, drawn from its own seeded generator."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if "layernorm" in name:
        return torch.ones(shape)
    std = INIT_STD
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        std = INIT_STD / math.sqrt(2.0 * num_blocks)  # megatron's scaled init for output projections
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return torch.randn(shape, generator=generator) * std


@torch.no_grad()
def init_from_seed(stage: StageModel, seed: int) -> None:
    """Give every local parameter its slice of the seeded logical tensor."""
    for name, param in stage.named_parameters():
        shard = stage.shards[name]
        full = init_tensor(shard.name, shard.logical_shape, seed, stage.spec.model.num_blocks)
        param.copy_(shard.shard_of(full))
