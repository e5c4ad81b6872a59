"""Text and JSONL files -> megatron-core's indexed dataset (PREFIX.bin + PREFIX.idx), for `sailor data prepare`.

A text file is one document; in a JSONL file (.jsonl, .ndjson, or .json as Megatron's "loose JSON") every
line is one, its text under the JSON key given. Each document is written with megatron-core's
IndexedDatasetBuilder, one add_document per document, ending with the tokenizer's end-of-document token
where it has one, in the dtype megatron picks for the vocabulary. So Megatron-LM reads the result as it
reads its own preprocess_data.py output, and sailor's training reads it like any Megatron data.

Both files are written under temporary names and renamed once complete; an output path that is one of
the inputs is refused before anything is written.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import SailorError
from sailor_ext.data import indexed_dataset_module
from sailor_ext.tokenizer import Tokenizer

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
BATCH_DOCUMENTS = 256  # documents per tokenizer call (the tokenizers library encodes a batch in parallel)
BATCH_CHARS = 1 << 22


@dataclass(frozen=True)
class Document:
    text: str
    where: str  # FILE or FILE:LINE, for progress and messages


@dataclass(frozen=True)
class Prepared:
    documents: int
    tokens: int
    vocab_size: int
    dtype: str
    files: tuple[str, str]  # .bin, .idx


Progress = Callable[[int, int, str], None]  # (documents, tokens, where) so far


def read_documents(path: str, json_key: str = "text") -> Iterator[Document]:
    p = Path(path)
    if p.suffix.lower() in JSONL_SUFFIXES:
        yield from _jsonl_documents(p, json_key)
        return
    data = p.read_bytes()
    if not data.strip():
        raise SailorError(f"input {p} is empty; give a file with text")
    yield Document(_decode(data, str(p)), str(p))


def _jsonl_documents(p: Path, key: str) -> Iterator[Document]:
    found = False
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{p}:{n}"
            try:
                record = json.loads(_decode(raw, where))
            except (ValueError, RecursionError) as e:  # a ValueError is also an integer too long for int()
                problem = (e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
                           if isinstance(e, RecursionError) else
                           f"a number of more than {sys.get_int_max_str_digits()} digits")
                raise SailorError(f"{where} is not JSON ({problem}); every line of a JSONL file must be one JSON "
                                  "object") from None
            if not isinstance(record, dict) or key not in record:
                keys = ", ".join(map(str, list(record)[:5])) if isinstance(record, dict) else \
                    f"a JSON {type(record).__name__}"
                raise SailorError(f"{where} has no key {key!r} (it holds {keys or 'nothing'}); name the text's key "
                                  "with --json-key")
            if not isinstance(record[key], str):
                raise SailorError(f"{where}: {key!r} holds a JSON {type(record[key]).__name__}, not text; name the "
                                  "text's key with --json-key")
            text = record[key]
            if not text.isascii():  # a JSON escape of half a UTF-16 pair decodes to a str no tokenizer can encode
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise SailorError(f"{where}: {key!r} is not valid UTF-8 text (a lone \\u{ord(text[e.start]):04x} "
                                      f"escape at character {e.start}); write the whole surrogate pair or the "
                                      "character itself") from None
            found = True
            yield Document(text, where)
    if not found:
        raise SailorError(f"input {p} is empty: it has no JSON lines; give a file with one JSON object per line")


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SailorError(f"{where} is not UTF-8 text (byte {e.start}); convert it, e.g. with iconv -t UTF-8") from None


def _batches(documents: Iterable[Document]) -> Iterator[list[Document]]:
    batch, chars = [], 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def check_prefix(prefix: str) -> None:
    """PREFIX names files: an empty one, or one ending in a directory ('dir/', '.'), would write hidden
    .bin and .idx files."""
    if not prefix.strip():
        raise SailorError(f"-o {prefix!r} is empty; give a prefix like data/train (writes data/train.bin and "
                          "data/train.idx)")
    if os.path.basename(prefix) in ("", ".", ".."):
        raise SailorError(f"-o {prefix!r} names a directory; give a prefix of files in it, like "
                          f"{os.path.join(prefix, 'train')} (writes train.bin and train.idx there)")


def check_paths(inputs: Sequence[str], outputs: Sequence[Path]) -> None:
    """Every input is a readable file and no output is one of them (before any work is done)."""
    if not inputs:
        raise SailorError("give at least one input file")
    for path in inputs:
        if not os.path.exists(path):
            raise SailorError(f"input {path} not found")
        if not os.path.isfile(path):
            raise SailorError(f"input {path} is not a file; give text or JSONL files")
        if not os.access(path, os.R_OK):
            raise SailorError(f"input {path} is not readable; check its permissions")
        for out in outputs:
            if out.exists() and os.path.samefile(out, path):
                raise SailorError(f"the output {out} is the input {path}; choose another -o prefix")


def prepare(inputs: Sequence[str], prefix: str, tokenizer: Tokenizer, json_key: str = "text",
            progress: Progress | None = None) -> Prepared:
    """Tokenize the inputs, in order, into PREFIX.bin and PREFIX.idx."""
    check_prefix(prefix)
    outputs = (Path(prefix + ".bin"), Path(prefix + ".idx"))
    check_paths(inputs, outputs)
    megatron = indexed_dataset_module()
    dtype = megatron.DType.optimal_dtype(tokenizer.vocab_size)
    outputs[0].parent.mkdir(parents=True, exist_ok=True)
    temps = tuple(p.with_name(f"{p.name}.{os.getpid()}.tmp") for p in outputs)
    eos = tokenizer.eos_id
    documents = tokens = 0
    builder = None
    try:
        builder = megatron.IndexedDatasetBuilder(str(temps[0]), dtype=dtype)
        for path in inputs:
            for batch in _batches(read_documents(path, json_key)):
                for ids in tokenizer.encode_batch([d.text for d in batch]):
                    ids = np.asarray(ids, dtype=np.int64)
                    if eos is not None and (not len(ids) or ids[-1] != eos):
                        ids = np.append(ids, eos)
                    builder.add_document(ids, [len(ids)])
                    tokens += len(ids)
                documents += len(batch)
                if progress:
                    progress(documents, tokens, batch[-1].where)
        builder.finalize(str(temps[1]))
        for temp, out in zip(temps, outputs):
            os.replace(temp, out)
    finally:
        if builder is not None and not builder.data_file.closed:
            builder.data_file.close()
        for temp in temps:
            temp.unlink(missing_ok=True)
    return Prepared(documents, tokens, tokenizer.vocab_size, np.dtype(dtype).name, tuple(map(str, outputs)))
