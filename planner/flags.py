"""The edge where flags come in: argparse types with ranges, and one-line usage errors.

Every number a flag takes is parsed here with its range (a port is 0-65535, a
batch a positive integer, a budget a positive finite number), so a command
receives typed values it can trust. `Parser` turns argparse's usage dump into
the one line every sailor mistake ends in.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Callable, Iterable

from planner.errors import SailorError
from planner.inputs import MAX_BATCH, MAX_COUNT, int_range, number_range, suggest

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


class UsageError(SailorError):
    """A flag argparse could not take; `reason` is argparse's own words, without the program's name."""

    def __init__(self, prog: str, reason: str):
        super().__init__(f"{prog}: {reason}; see `{prog} --help`")
        self.reason = reason


def _terminal_width() -> int:
    """What shutil.get_terminal_size reads: $COLUMNS, else stdout's terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, at the same width, without importing shutil for it: argparse makes a formatter
    for every flag it adds (to check the flag), and shutil's import (with zlib, bz2 and lzma) was
    a noticeable part of a `sailor plan` process."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position,
                         _terminal_width() - 2 if width is None else width)  # (argparse's own margin)


class Parser(argparse.ArgumentParser):
    """argparse, with its mistakes as one line: `sailor: error: sailor plan: argument --top: ...`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)  # (for error's hint)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        # argparse takes a value that begins with '-' (and is no plain number) for a flag: say how to give it
        match = re.fullmatch(r"argument (--[\w-]+)(?:/\S+)?: expected one argument", message)
        given = getattr(self, "_given", [])
        if match and any(a == match.group(1) and b.startswith("-") for a, b in zip(given, given[1:])):
            message += f" (a value that begins with '-' goes after '=': {match.group(1)}=VALUE)"
        raise UsageError(self.prog, message)


def _type(name: str, convert: Callable[[str], object]) -> Callable[[str], object]:
    convert.__name__ = name  # argparse names the type in some messages
    return convert


def integer(lo: int | None = 1, hi: int | None = None) -> Callable[[str], int]:
    """An integer flag in [lo, hi] (lo=1: positive)."""
    def convert(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {int_range(lo, hi)}, not {text!r}")
        return value

    return _type("integer", convert)


def number(lo: float | None = None, hi: float | None = None, above: float | None = None,
           below: float | None = None) -> Callable[[str], float]:
    """A finite number flag, >= lo (or > above) and <= hi (or < below)."""
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (lo is not None and value < lo) or (above is not None and value <= above) \
                or (hi is not None and value > hi) or (below is not None and value >= below):
            raise argparse.ArgumentTypeError(f"must be {number_range(lo, hi, above, below)}, not {text!r}")
        return value

    return _type("number", convert)


def int_list(lo: int = 1, hi: int = MAX_BATCH) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, e.g. 1,2,4."""
    def convert(text: str) -> tuple[int, ...]:
        items = [x.strip() for x in text.split(",")]
        try:
            values = tuple(int(x) for x in items)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: write comma-separated integers, e.g. 1,2,4") from None
        if any(v < lo or v > hi for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: each value must be from {lo} to {hi}")
        return values

    return _type("list", convert)


def choice_list(choices: Iterable[str]) -> Callable[[str], tuple[str, ...]]:
    """Comma-separated names, each one of `choices`."""
    choices = tuple(choices)

    def convert(text: str) -> tuple[str, ...]:
        items = [x.strip() for x in text.split(",")]
        for x in items:
            if x not in choices:
                raise argparse.ArgumentTypeError(f"{x!r} is not one of {', '.join(choices)}{suggest(x, choices)}")
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"{text!r} names one twice")
        return tuple(items)

    return _type("list", convert)


def plot_file(text: str) -> str:
    """A plot's file name: its suffix picks the format matplotlib writes."""
    if not text.lower().endswith(PLOT_SUFFIXES):
        raise argparse.ArgumentTypeError(f"{text!r}: name the file .png, .svg or .pdf (the suffix picks the format)")
    return text


def nonempty(what: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty; give {what}")
        return text

    return _type("text", convert)


port = integer(0, 65535)
positive = integer(1)
count = integer(1, MAX_COUNT)
batch = integer(1, MAX_BATCH)
seq_length = integer(1, 1 << 24)
seconds = number(above=0.0, hi=1e9)
budget = number(above=0.0, hi=1e12)


def require_module(module: str, extra: str, what: str) -> None:
    """Stop with one line when an optional dependency is missing (before any output is written)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        found = False
    if not found:
        raise SailorError(f"{what} needs {module.split('.')[0]}, which is not installed; install it with "
                          f"pip install 'sailor[{extra}]' (or pip install -e '.[{extra}]' in a checkout)")

