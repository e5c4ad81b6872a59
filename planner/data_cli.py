"""`sailor data prepare`: tokenize text or JSONL files into megatron-core's indexed dataset for training.

    sailor data prepare INPUT... -o PREFIX [--tokenizer bytes|tokenizer.json|MODEL_DIR] [--json-key text]

Tokenizing needs the runtime extra (megatron-core, tokenizers, transformers; sailor_ext.prepare); this
module only parses arguments and prints, so `sailor` itself starts without them.
"""
from __future__ import annotations

import argparse
import sys
import time

from planner.errors import SailorError

PROGRESS_EVERY_S = 2.0


class _Progress:
    """Documents and tokens so far on stderr, at most every PROGRESS_EVERY_S (nothing for short inputs)."""

    def __init__(self):
        self.start, self.last = time.monotonic(), None
        self.tty, self.shown = sys.stderr.isatty(), False

    def __call__(self, documents: int, tokens: int, where: str) -> None:
        now = time.monotonic()
        if self.last is None:  # the first batch: start-up time is not progress
            self.last = now
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last, self.shown = now, True
        line = f"sailor: {documents:,} documents, {tokens:,} tokens ({now - self.start:.0f} s; at {where})"
        print(f"\r{line}\033[K" if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and self.shown:
            print(file=sys.stderr)


def cmd_prepare(args) -> int:
    progress = None if args.quiet else _Progress()
    try:
        from sailor_ext.prepare import prepare
        from sailor_ext.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
        done = prepare(args.inputs, args.output, tokenizer, args.json_key, progress)
    except ModuleNotFoundError as e:
        raise SailorError(f"sailor data prepare needs the runtime extra ({e.name} is missing); install it with "
                          "pip install -e '.[runtime]'") from None
    finally:
        if progress:
            progress.done()
    eos = "with" if tokenizer.eos_id is not None else "no"
    print(f"prepared {done.documents:,} documents, {done.tokens:,} tokens ({eos} end-of-document token), vocabulary "
          f"{done.vocab_size:,} ({tokenizer.name}, {done.dtype}): wrote {done.files[0]} and {done.files[1]}")
    return 0


def add_parser(subparsers, add_common=None) -> argparse.ArgumentParser:
    p = subparsers.add_parser("data", help="prepare training data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="data_command", required=True, metavar="WHAT", help="one of:")
    d = sub.add_parser("prepare", help="tokenize text or JSONL files into a megatron indexed dataset",
                       description="Tokenize text files (one document each) or JSONL files (one document per line) "
                                   "into PREFIX.bin and PREFIX.idx, megatron-core's indexed dataset, each document "
                                   "ending with the tokenizer's end-of-document token if it has one. Training reads "
                                   "it with --data-path PREFIX, as Megatron-LM does.")
    d.add_argument("inputs", nargs="+", metavar="INPUT", help="text files; .jsonl, .ndjson and .json files are read "
                   "as JSON lines")
    d.add_argument("-o", "--output", required=True, metavar="PREFIX", help="writes PREFIX.bin and PREFIX.idx")
    d.add_argument("--tokenizer", default="bytes", metavar="PATH",
                   help="a tokenizer.json, a local model directory with its tokenizer files, or 'bytes' (byte-level, "
                        "vocabulary 256; the default, needs no files)")
    d.add_argument("--json-key", default="text", metavar="KEY",
                   help="the key holding each JSON line's text (default text)")
    d.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary; errors only")
    d.set_defaults(func=cmd_prepare)
    return p
