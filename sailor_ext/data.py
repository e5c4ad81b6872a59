"""Training samples: megatron-core indexed datasets (split and blended as Megatron does) or synthetic ones.

A sample is seq_len + 1 tokens (inputs and next-token labels). Global sample
i of the run is fixed by the seed alone; a step uses the next G samples
(G = global batch size; step t uses [t * G, (t + 1) * G)), and pipeline k takes the
contiguous slice starting at sum_{j<k} mbs_j * n_j, microbatch by microbatch.
So every sample of the global batch is used exactly once per step, whatever
the plan, and resuming needs only the count of samples consumed.

`--data-path` names Megatron's indexed datasets (PREFIX.bin + PREFIX.idx, from
`sailor data prepare`, Megatron-LM's preprocess_data.py or any
IndexedDatasetBuilder), read through megatron-core's IndexedDataset (mmap):

* split: `--split 969,30,1` cuts each dataset's documents (the index's
  sequences, which Megatron's GPT dataset splits) into train, validation and
  test ranges, rounded as Megatron rounds them.
* samples: a split's documents, in order, are one token stream. Sample j of an
  epoch starts at token seq_len * p(j), p a seeded permutation per epoch;
  consecutive windows share their boundary token (as in Megatron), so every
  token is a label once per epoch. A window may cross documents; the
  end-of-document token between them marks the boundary.
* blend: with weights (`W1 PREFIX1 W2 PREFIX2 ...`), global sample i goes to
  a dataset by a fixed pattern of BLEND_PERIOD samples, repeated: in it each
  next sample goes to the dataset furthest below its weight's share (Megatron's
  greedy rule), so every prefix of the pattern follows the weights within one
  sample per dataset. Without weights the shares follow the datasets' sizes,
  as in Megatron.
* vocabulary: every token id must be below the model's vocabulary; checked
  when a dataset is opened (one pass over its .bin unless its dtype cannot
  hold a larger id).

Validation samples follow the same rules over the validation split (or a
second synthetic stream); every evaluation uses the first batches of it, so
validation losses along a run are comparable and need no checkpointed state.
"""
from __future__ import annotations

import math
import os
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from planner.errors import SailorError
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan

SPLITS = ("train", "validation", "test")
DEFAULT_SPLIT = "969,30,1"  # Megatron-LM's default
BLEND_PERIOD = 4096
SCAN_TOKENS = 1 << 26  # tokens per read of the vocabulary check


class Source(Protocol):
    def sample(self, index: int) -> np.ndarray: ...


class SyntheticTokens:
    """Arithmetic sequences modulo the vocabulary: random start and stride per
    sample, so the next token is learnable and the loss falls as it trains.
    `stream` 1 is the validation data, disjoint from training's stream 0."""

    def __init__(self, vocab: int, seq_len: int, seed: int, stream: int = 0):
        self.vocab, self.seq_len, self.seed, self.stream = vocab, seq_len, seed, stream

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index, self.stream] if self.stream else [self.seed, index])
        start, stride = rng.integers(0, self.vocab), rng.integers(1, 8)
        return (start + stride * np.arange(self.seq_len + 1)) % self.vocab


# -- arguments -------------------------------------------------------------------------
@dataclass(frozen=True)
class Blend:
    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None  # None: in proportion to the datasets' sizes


def parse_blend(words: Sequence[str]) -> Blend:
    """Megatron's `--data-path PREFIX...` or `--data-path W1 PREFIX1 W2 PREFIX2 ...`."""
    numbers = [_number(w) for w in words]
    shown = " ".join(words)
    if all(n is None for n in numbers):
        return Blend(tuple(words), None)
    weights, prefixes = numbers[0::2], list(words[1::2])
    if len(words) % 2 or any(w is None for w in weights) or any(n is not None for n in numbers[1::2]):
        raise SailorError(f"--data-path {shown}: give prefixes, or weights and prefixes in turn, a weight before each "
                          "prefix (W1 PREFIX1 W2 PREFIX2 ...)")
    for w, prefix in zip(weights, prefixes):
        if w < 0 or not math.isfinite(w):
            raise SailorError(f"--data-path {shown}: the weight {w:g} of {prefix} is not a non-negative number; "
                              "weights are shares (normalised to sum to 1)")
    if sum(weights) <= 0:
        raise SailorError(f"--data-path {shown}: the weights sum to 0; give at least one dataset a positive weight")
    return Blend(tuple(prefixes), tuple(weights))


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def parse_split(text: str) -> tuple[float, float, float]:
    """Megatron's `--split 969,30,1`: train, validation and test shares (missing ones are 0), normalised."""
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        shares = []
    if not 1 <= len(shares) <= 3 or not all(math.isfinite(s) and s >= 0 for s in shares) or sum(shares) <= 0:
        raise SailorError(f"--split {text!r} is not train,validation,test shares: give up to three non-negative "
                          "numbers, e.g. 969,30,1 (the default) or 90,10,0")
    shares += [0.0] * (3 - len(shares))
    total = sum(shares)
    return tuple(s / total for s in shares)


def split_documents(num_documents: int, shares: tuple[float, float, float], which: int) -> range:
    """The documents of split `which`, rounded as Megatron's dataset builder rounds them."""
    lo, hi = sum(shares[:which]), sum(shares[: which + 1])
    return range(int(round(lo * num_documents)), int(round(hi * num_documents)))


# -- one dataset -----------------------------------------------------------------------
def indexed_dataset_module():
    """megatron.core.datasets.indexed_dataset, imported without megatron's notices about Apex and
    Transformer Engine (which it does not use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def open_indexed(prefix: str, vocab: int):
    """megatron-core's IndexedDataset at `prefix`, refused unless complete and within the vocabulary."""
    IndexedDataset = indexed_dataset_module().IndexedDataset
    hint = "give the prefix of a megatron indexed dataset (without .bin/.idx), e.g. one `sailor data prepare` wrote"
    for suffix in (".idx", ".bin"):
        if not os.path.isfile(prefix + suffix):
            raise SailorError(f"--data-path {prefix}: {prefix}{suffix} not found; {hint}")
    if os.path.getsize(prefix + ".bin") == 0:
        raise SailorError(f"--data-path {prefix}: {prefix}.bin holds no tokens; prepare it from a non-empty text")
    dataset = IndexedDataset.__new__(IndexedDataset)
    try:
        dataset.__init__(prefix, mmap=True)
    except (AssertionError, ValueError, OSError, KeyError, IndexError, struct.error, OverflowError) as e:
        for half in ("bin_reader", "index"):  # its __del__ deletes both, and would complain on stderr
            vars(dataset).setdefault(half, None)
        raise SailorError(f"--data-path {prefix}: {prefix}.idx is not a megatron indexed dataset index "
                          f"({str(e).strip() or type(e).__name__}); {hint}") from None
    lengths, pointers = dataset.sequence_lengths, dataset.index.sequence_pointers
    itemsize = dataset.index.dtype_size
    if len(lengths) and (int(pointers.min()) < 0 or int(lengths.min()) < 0):
        raise SailorError(f"--data-path {prefix}: {prefix}.idx holds a negative offset or length; the pair is damaged, "
                          "prepare it again")
    end = int(pointers[-1]) + int(lengths[-1]) * itemsize if len(lengths) else 0
    if end > os.path.getsize(prefix + ".bin"):
        raise SailorError(f"--data-path {prefix}: {prefix}.idx describes {end} bytes of tokens but {prefix}.bin "
                          f"holds {os.path.getsize(prefix + '.bin')}; the pair is incomplete, prepare it again")
    if len(lengths) and int(pointers[-1]) - int(pointers[0]) != int(lengths[:-1].sum(dtype=np.int64)) * itemsize:
        raise SailorError(f"--data-path {prefix}: the documents of {prefix}.bin are not stored back to back; "
                          "rewrite it with megatron's IndexedDatasetBuilder (sailor data prepare)")
    check_vocabulary(dataset, prefix, vocab)
    return dataset


def check_vocabulary(dataset, prefix: str, vocab: int) -> None:
    """Every token id in [0, vocab): one pass over the .bin, unless its dtype cannot hold another id."""
    dtype = np.dtype(dataset.index.dtype)
    if not np.issubdtype(dtype, np.integer):
        raise SailorError(f"--data-path {prefix}: {prefix}.bin holds {dtype} values, not token ids; prepare it "
                          "with `sailor data prepare`")
    if np.iinfo(dtype).min >= 0 and np.iinfo(dtype).max < vocab:
        return
    lo, hi = token_range(dataset)
    if lo < 0:
        raise SailorError(f"--data-path {prefix}: the data holds a negative token id ({lo}); prepare it again")
    if hi >= vocab:
        raise SailorError(f"--data-path {prefix}: the data holds token id {hi} but the model's vocabulary has "
                          f"{vocab} entries; tokenize it with the model's tokenizer, or train a model whose "
                          f"vocabulary is at least {hi + 1}")


def token_range(dataset) -> tuple[int, int]:
    """The smallest and largest token id in the dataset, read SCAN_TOKENS at a time."""
    total = int(dataset.sequence_lengths.sum(dtype=np.int64))
    start = int(dataset.index.sequence_pointers[0]) if total else 0
    lo, hi = 0, -1
    for first in range(0, total, SCAN_TOKENS):
        chunk = dataset.bin_reader.read(dataset.index.dtype, min(SCAN_TOKENS, total - first),
                                        start + first * dataset.index.dtype_size)
        lo, hi = min(lo, int(chunk.min())), max(hi, int(chunk.max()))
    return lo, hi


class IndexedTokens:
    """One split of one indexed dataset: its documents as one token stream, cut into windows of
    seq_len + 1 tokens, shuffled per epoch."""

    def __init__(self, dataset, documents: range, seq_len: int, key: tuple[int, ...]):
        self.dataset, self.seq_len, self.key = dataset, seq_len, key
        self.dtype, self.itemsize = dataset.index.dtype, dataset.index.dtype_size
        lengths = dataset.sequence_lengths[documents.start: documents.stop]
        self.num_documents = len(lengths)
        self.num_tokens = int(lengths.sum(dtype=np.int64))
        # The .idx stores each document's offset as the running sum of the lengths before it, so a split's
        # documents are one contiguous run of the .bin (open_indexed checks it).
        self.offset = int(dataset.index.sequence_pointers[documents.start]) if self.num_documents else 0
        self.num_samples = max(0, (self.num_tokens - 1) // seq_len)
        self._epoch, self._order = -1, None

    def sample(self, index: int) -> np.ndarray:
        epoch, i = divmod(index, self.num_samples)
        if epoch != self._epoch:
            order = np.arange(self.num_samples, dtype=np.uint32 if self.num_samples < 2**32 else np.int64)
            np.random.default_rng([*self.key, epoch]).shuffle(order)
            self._epoch, self._order = epoch, order
        start = self.offset + int(self._order[i]) * self.seq_len * self.itemsize
        return self.dataset.bin_reader.read(self.dtype, self.seq_len + 1, start).astype(np.int64)


# -- blending --------------------------------------------------------------------------
def blend_pattern(weights: Sequence[float], period: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dataset of each position, its rank among that dataset's positions, positions per dataset) of one
    period: each position goes to the dataset furthest below weight x positions so far (ties: the first)."""
    w = np.asarray(weights, dtype=np.float64) / sum(weights)
    taken = np.zeros(len(w), dtype=np.int64)
    dataset = np.empty(period, dtype=np.int64)
    rank = np.empty(period, dtype=np.int64)
    for i in range(period):
        d = int(np.argmax(w * (i + 1) - taken))
        dataset[i], rank[i] = d, taken[d]
        taken[d] += 1
    return dataset, rank, taken


class Blended:
    """Global sample i -> sample `block * per_period[d] + rank` of dataset d, by a pattern repeated every
    BLEND_PERIOD samples, so any sample is found without replaying the ones before it."""

    def __init__(self, parts: Sequence[Source], weights: Sequence[float], period: int = BLEND_PERIOD):
        self.parts, self.period = list(parts), period
        self.dataset, self.rank, self.per_period = blend_pattern(weights, period)

    def sample(self, index: int) -> np.ndarray:
        block, position = divmod(index, self.period)
        d = int(self.dataset[position])
        return self.parts[d].sample(block * int(self.per_period[d]) + int(self.rank[position]))


# -- what training reads ---------------------------------------------------------------
@dataclass(frozen=True)
class DataSources:
    train: Source
    validation: Source | None


def open_data(data_path: Sequence[str] | None, split: str, vocab: int, seq_len: int, seed: int,
              validation: bool) -> DataSources:
    """The training (and, if asked, validation) samples; synthetic without a --data-path."""
    if not data_path:
        return DataSources(SyntheticTokens(vocab, seq_len, seed), SyntheticTokens(vocab, seq_len, seed, stream=1))
    blend, shares = parse_blend(data_path), parse_split(split)
    datasets = [open_indexed(prefix, vocab) for prefix in blend.prefixes]
    return DataSources(_split_source(blend, datasets, shares, 0, seq_len, seed, split),
                       _split_source(blend, datasets, shares, 1, seq_len, seed, split) if validation else None)


def _split_source(blend: Blend, datasets: list, shares, which: int, seq_len: int, seed: int, split: str) -> Source:
    parts = []
    for k, (prefix, dataset) in enumerate(zip(blend.prefixes, datasets)):
        documents = split_documents(len(dataset.sequence_lengths), shares, which)
        part = IndexedTokens(dataset, documents, seq_len, (seed, which, k))
        if part.num_samples < 1 and (blend.weights is None or blend.weights[k] > 0):
            use = "training" if which == 0 else "validation (drop --eval-interval/--eval-iters to train without it)"
            raise SailorError(f"--data-path {prefix}: its {SPLITS[which]} split (--split {split}: {part.num_documents}"
                              f" of {len(dataset.sequence_lengths)} documents, {part.num_tokens} tokens) is shorter "
                              f"than one sample of {seq_len + 1} tokens, needed for {use}; give more documents, a "
                              f"larger {SPLITS[which]} share in --split, or a shorter --seq-length")
        parts.append(part)
    if len(parts) == 1:
        return parts[0]
    weights = blend.weights or tuple(float(p.num_samples) for p in parts)
    return Blended(parts, weights)


@dataclass(frozen=True)
class BatchSlicer:
    """Which global samples each pipeline's microbatches hold."""

    plan: Plan

    def microbatch(self, consumed: int, pipeline: int, index: int) -> range:
        """Samples of microbatch `index` of `pipeline` in the step that starts
        after `consumed` samples (consumed = step * G when G never changed)."""
        before = sum(p.samples for p in self.plan.pipelines[:pipeline])
        mbs = self.plan.pipelines[pipeline].microbatch_size
        start = consumed + before + index * mbs
        return range(start, start + mbs)


def microbatches(source: Source, slicer: BatchSlicer, consumed: int, pipeline: int) -> list[np.ndarray]:
    """Tokens [mbs, seq + 1] of every microbatch of `pipeline` in the next step."""
    n = slicer.plan.pipelines[pipeline].num_microbatches
    return [np.stack([source.sample(i) for i in slicer.microbatch(consumed, pipeline, m)]) for m in range(n)]


# -- what training asks for (from train.py's arguments) ---------------------------------------
EVAL_ITERS = 100  # Megatron-LM's default --eval-iters


@dataclass(frozen=True)
class Evaluation:
    """When validation runs (Megatron's --eval-interval and --eval-iters)."""

    interval: int  # every N steps, and after the last (0: after the last only)
    iters: int  # batches of the global batch size per evaluation (0: never)

    def due(self, step: int, last: int) -> bool:
        return self.iters > 0 and (step == last or (self.interval > 0 and step % self.interval == 0))


def evaluation(args) -> Evaluation:
    if args.eval_interval is not None and args.eval_interval < 1:
        raise SailorError(f"--eval-interval {args.eval_interval} must be at least 1 (steps between evaluations)")
    if args.eval_iters is not None and args.eval_iters < 0:
        raise SailorError(f"--eval-iters {args.eval_iters} must be >= 0 (0: no validation)")
    iters = args.eval_iters if args.eval_iters is not None else (EVAL_ITERS if args.eval_interval else 0)
    return Evaluation(args.eval_interval or 0, iters)


def open_training_data(args, model: ModelSpec) -> DataSources:
    """The training and validation samples; bad data paths fail here, before any process group forms."""
    return open_data(args.data_path, args.split, model.vocab, model.seq_len, args.seed, evaluation(args).iters > 0)
