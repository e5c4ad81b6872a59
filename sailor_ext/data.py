"""Training samples: a memory-mapped token file or a synthetic source.

A sample is seq_len + 1 tokens (inputs and next-token labels). Global sample
i of the run is fixed by the seed alone; a step uses the next G samples
(G = global batch size; step t uses [t * G, (t + 1) * G)), and pipeline k takes the
contiguous slice starting at sum_{j<k} mbs_j * n_j, microbatch by microbatch.
So every sample of the global batch is used exactly once per step, whatever
the plan, and resuming needs only the count of samples consumed.

Token file format (`build_token_file`): `NAME.bin` holds the tokens as
little-endian uint16 (vocabularies up to 65536) and `NAME.json` describes it:
{"format": "sailor-tokens", "version": 1, "dtype": "uint16", "num_tokens": N,
 "vocab_size": V, "tokenizer": "bytes"}. The built-in tokenizer is byte-level
(token = UTF-8 byte, vocabulary 256): it needs no downloaded files and fits
every model's vocabulary. Samples are non-overlapping windows of the file,
shuffled per epoch with a seeded permutation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import SailorError
from planner.specs.plan import Plan

BYTE_VOCAB = 256


class SyntheticTokens:
    """Arithmetic sequences modulo the vocabulary: random start and stride per
    sample, so the next token is learnable and the loss falls as it trains."""

    def __init__(self, vocab: int, seq_len: int, seed: int):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index])
        start, stride = rng.integers(0, self.vocab), rng.integers(1, 8)
        return (start + stride * np.arange(self.seq_len + 1)) % self.vocab


class TokenFile:
    """Non-overlapping windows of a memory-mapped token file."""

    def __init__(self, path: str, vocab: int, seq_len: int, seed: int):
        bin_path, meta_path = _paths(path)
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            raise SailorError(f"token file {meta_path} not found; build one with "
                              "`python -m sailor_ext.data TEXT_FILE OUTPUT_PREFIX`") from None
        if meta.get("format") != "sailor-tokens":
            raise SailorError(f"{meta_path} is not a sailor token file (format {meta.get('format')!r})")
        if meta["vocab_size"] > vocab:
            raise SailorError(f"token file {bin_path} uses a vocabulary of {meta['vocab_size']} but the model has "
                              f"{vocab}; use a model with a larger vocabulary")
        self.tokens = np.memmap(bin_path, dtype=np.dtype(meta["dtype"]).newbyteorder("<"), mode="r")
        self.seq_len, self.seed = seq_len, seed
        self.num_samples = (len(self.tokens) - 1) // seq_len
        if self.num_samples < 1:
            raise SailorError(f"token file {bin_path} has {len(self.tokens)} tokens, fewer than one sample of "
                              f"{seq_len + 1}; use a longer text or a shorter --seq-length")
        self._epoch, self._order = -1, None

    def sample(self, index: int) -> np.ndarray:
        epoch, i = divmod(index, self.num_samples)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        start = int(self._order[i]) * self.seq_len
        return np.asarray(self.tokens[start: start + self.seq_len + 1], dtype=np.int64)


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


def microbatches(source, slicer: BatchSlicer, consumed: int, pipeline: int) -> list[np.ndarray]:
    """Tokens [mbs, seq + 1] of every microbatch of `pipeline` in the next step."""
    n = slicer.plan.pipelines[pipeline].num_microbatches
    return [np.stack([source.sample(i) for i in slicer.microbatch(consumed, pipeline, m)]) for m in range(n)]


def _paths(prefix: str) -> tuple[Path, Path]:
    p = Path(prefix)
    if p.suffix in (".bin", ".json"):
        p = p.with_suffix("")
    return p.with_suffix(".bin"), p.with_suffix(".json")


def build_token_file(text_path: str, prefix: str) -> dict:
    """Tokenize a text file byte by byte into PREFIX.bin + PREFIX.json."""
    try:
        data = Path(text_path).read_bytes()
    except FileNotFoundError:
        raise SailorError(f"text file {text_path} not found") from None
    bin_path, meta_path = _paths(prefix)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    tokens = np.frombuffer(data, dtype=np.uint8).astype("<u2")
    tmp = bin_path.with_suffix(".bin.tmp")
    tokens.tofile(tmp)
    tmp.replace(bin_path)
    meta = {"format": "sailor-tokens", "version": 1, "dtype": "uint16", "num_tokens": int(tokens.size),
            "vocab_size": BYTE_VOCAB, "tokenizer": "bytes", "source": str(text_path)}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m sailor_ext.data",
                                     description="Build a byte-level token file from a text file.")
    parser.add_argument("text", help="input text file")
    parser.add_argument("output", help="output prefix: writes OUTPUT.bin and OUTPUT.json")
    args = parser.parse_args(argv)
    try:
        meta = build_token_file(args.text, args.output)
    except SailorError as e:
        print(f"sailor: error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"wrote {meta['num_tokens']} tokens to {_paths(args.output)[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
