"""Tokenizers for `sailor data prepare`: byte-level, a tokenizer.json, or a local Hugging Face model.

Each gives token ids for a batch of texts, its vocabulary size (the data's dtype and the model's
vocabulary must hold every id) and its end-of-document token, appended to every document so the
model sees where one ends and the next begins. Nothing is downloaded: a model directory is read
with `local_files_only`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import SailorError

BYTES = "bytes"
# The end-of-document tokens of common tokenizers, for a tokenizer.json without a
# tokenizer_config.json beside it to name its EOS token.
KNOWN_EOS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[EOS]")


@dataclass(frozen=True)
class Tokenizer:
    name: str
    vocab_size: int
    eos_id: int | None
    encode_batch: Callable[[list[str]], Sequence[Sequence[int]]]


def load_tokenizer(spec: str) -> Tokenizer:
    """`bytes`, a tokenizer.json file, or a directory holding a model's tokenizer files."""
    if spec == BYTES:
        return Tokenizer(BYTES, 256, None, lambda texts: [np.frombuffer(t.encode(), dtype=np.uint8) for t in texts])
    path = Path(spec)
    if not path.exists():
        raise SailorError(f"tokenizer {spec} not found; give a tokenizer.json, a model directory with its "
                          f"tokenizer files, or '{BYTES}'")
    return _from_directory(path) if path.is_dir() else _from_json(path)


def _from_json(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as e:  # the library's errors are plain Exceptions with a Rust message
        raise SailorError(f"{path} is not a tokenizer the tokenizers library can read ({_first_line(e)}); give a "
                          "tokenizer.json or a model directory") from None
    tok.no_truncation()  # a saved truncation setting would cut documents short
    tok.no_padding()
    ids = tok.get_vocab(with_added_tokens=True).values()
    if not ids:
        raise SailorError(f"{path} has an empty vocabulary; give the tokenizer.json of a trained tokenizer")
    vocab = max(tok.get_vocab_size(with_added_tokens=True), max(ids) + 1)
    eos = _configured_eos(path.parent / "tokenizer_config.json")
    eos_id = next((i for t in ((eos,) if eos else KNOWN_EOS) if (i := tok.token_to_id(t)) is not None), None)
    return Tokenizer(str(path), vocab, eos_id, lambda texts: [e.ids for e in tok.encode_batch(texts)])


def _configured_eos(config: Path) -> str | None:
    try:
        eos = json.loads(config.read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return eos if isinstance(eos, str) else None  # (a number or a list names no token: the known ones are tried)


def _from_directory(path: Path) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging

        logging.set_verbosity_error()  # its notices would interleave with our progress lines
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise SailorError(f"cannot load a tokenizer from directory {path} ({_first_line(e)}); it needs the model's "
                          "tokenizer files (tokenizer.json and tokenizer_config.json)") from None
    ids = tok.get_vocab().values()
    if not ids:
        raise SailorError(f"the tokenizer in {path} has an empty vocabulary; give a trained model's tokenizer files")
    vocab = max(len(tok), max(ids) + 1)

    def encode(texts: list[str]) -> list[list[int]]:
        return tok(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]

    return Tokenizer(str(path), vocab, tok.eos_token_id, encode)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]
