"""The edge where files come in: read them, and check every field into a typed value.

Every file a user hands sailor (plans in both formats, cluster files, profiles
in both layouts, network fits, traces, Hugging Face configs) is read with
`read_text`/`read_document` and walked with `Doc`, a value that knows the file
and the field it came from. A check that fails raises SailorError with one
line naming the file, the field, the value and what is expected, so the code
inside works on typed values and never needs a try/except of its own.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Iterable, NoReturn

from planner.errors import SailorError

MAX_COUNT = 1 << 20  # GPUs of a pool, replicas, pipelines: beyond any real cluster
MAX_BATCH = 1 << 24  # samples per iteration (16.8 M)
FLOAT_MAX = sys.float_info.max  # a JSON integer beyond it has no float: `abs(x) <= FLOAT_MAX` also refuses NaN, inf


def short(value: Any, width: int = 40) -> str:
    """A value as the user wrote it, cut to fit in a message; never fails, since it only builds one."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    try:
        text = json.dumps(value) if isinstance(value, (dict, list, bool)) or value is None else repr(value)
    except Exception:  # a YAML alias inside itself, an int beyond Python's digit limit, nesting beyond recursion
        try:
            text = repr(value)
        except Exception:
            return f"a {type(value).__name__}"
    return text if len(text) <= width else text[:width - 3] + "..."


def suggest(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for a near miss, else ''."""
    import difflib  # only for a message

    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


# -- files ---------------------------------------------------------------------------
def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file the user named; `what` says which file it is (e.g. "plan file")."""
    p = Path(path)
    try:
        data = _read_pipe(p, what, path) if stat.S_ISFIFO(p.stat().st_mode) else p.read_bytes()
    except FileNotFoundError:
        raise SailorError(f"{what} {path} not found; check the path") from None
    except IsADirectoryError:
        raise SailorError(f"{what} {path} is a directory; give a file") from None
    except PermissionError:
        raise SailorError(f"{what} {path} cannot be read (permission denied)") from None
    except OSError as e:
        raise SailorError(f"{what} {path} cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SailorError(f"{what} {path} is not UTF-8 text (byte {e.start}); give the file itself, not a binary "
                          "or another encoding") from None
    if not text.strip():
        raise SailorError(f"{what} {path} is empty")
    return text


def _read_pipe(p: Path, what: str, path) -> bytes:
    """A named pipe's bytes (process substitution, <(...), gives one): opened without blocking, so a pipe
    that nothing writes to is refused instead of waited on forever; with a writer, read to its end."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        try:
            first = os.read(fd, 1 << 16)
        except BlockingIOError:  # a writer, nothing written yet
            first = None
        if first == b"":
            raise SailorError(f"{what} {path} is a named pipe that nothing writes to; give a regular file")
        os.set_blocking(fd, True)
        chunks = [first or b""]
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


# \ud800-\udfff escapes half a UTF-16 pair; a pair decodes to one character, one half alone to no text
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_LONG_INT = "holds an integer of thousands of digits, beyond any field's range; check the file"


def parse_json(text: str, where: str) -> Any:
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as e:
        raise SailorError(f"{where} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except ValueError as e:  # NaN, Infinity; an integer beyond Python's digit limit
        if "digits" in str(e):
            raise SailorError(f"{where} {_LONG_INT}") from None
        raise SailorError(f"{where} is not valid JSON ({e}); write a finite number") from None
    except RecursionError:
        raise SailorError(f"{where} is nested too deeply to be a sailor file") from None
    if _SURROGATE_ESCAPE.search(text):  # rare: only then walk the document
        _refuse_lone_surrogates(value, where)
    return value


def _refuse_lone_surrogates(value: Any, where: str) -> None:
    """A lone \\ud800 decodes to a str that no output can encode: refuse it here, not when printing it."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            todo += v
            todo += v.values()
        elif isinstance(v, list):
            todo += v
        elif isinstance(v, str) and _SURROGATE.search(v):
            half = ord(_SURROGATE.search(v).group())
            raise SailorError(f"{where}: {short(v)} is not valid text (a lone \\u{half:04x} escape); write the "
                              "character itself, or both halves of its surrogate pair")


def read_document(path: str | Path, what: str) -> "Doc":
    """A JSON file (or YAML, by its suffix) as a Doc; a key written twice in one object is refused (JSON's
    and YAML's parsers keep the last silently)."""
    text = read_text(path, what)
    where = f"{what} {path}"
    if Path(path).suffix in (".yaml", ".yml"):
        import yaml

        try:
            value = yaml.load(text, Loader=_yaml_loader())
        except yaml.YAMLError as e:
            raise SailorError(f"{where} is not valid YAML ({' '.join(str(e).split())})") from None
        except ValueError as e:  # a value its constructor refuses: an integer beyond the digit limit, a bad date
            if "digits" in str(e):
                raise SailorError(f"{where} {_LONG_INT}") from None
            raise SailorError(f"{where} is not valid YAML ({e})") from None
        except RecursionError:
            raise SailorError(f"{where} is nested too deeply to be a sailor file") from None
    else:
        value = parse_json(text, where)
        try:
            json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKey as e:
            raise SailorError(f"{where} gives {short(e.args[0])} twice in one object; keep one") from None
    return Doc(value, where)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


_YAML_LOADER = None


def _yaml_loader():
    """PyYAML's safe loader with YAML 1.2's core schema. PyYAML resolves plain scalars by YAML 1.1,
    where a zone named `no` is False, `count: 1:30` is 90 (base 60), `010` is 8 and `2024-01-01` a
    date. Here only true/false, null, decimal (or 0o/0x) integers and floats are resolved; every
    other plain scalar stays the string it looks like, so a field's check sees what the user wrote."""
    global _YAML_LOADER
    if _YAML_LOADER is None:
        import yaml

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where built

        class Yaml12Loader(base):
            pass

        # keep only merge keys (<<) from 1.1's resolvers; bool, int, float, null, timestamp and the
        # `=` / `!` oddities are replaced or dropped
        Yaml12Loader.yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers if tag == "tag:yaml.org,2002:merge"]
            for first, resolvers in base.yaml_implicit_resolvers.items()}
        for tag, pattern, first in (
                ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
                ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
                ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
                ("float", r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                          r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", "-+0123456789.")):
            Yaml12Loader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(f"^(?:{pattern})$"),
                                               list(first))

        def construct_int(loader, node):  # decimal even with leading zeros (1.1 read 010 as octal)
            text = loader.construct_scalar(node)
            if text[:2] in ("0o", "0x"):
                return int(text[2:], 8 if text[1] == "o" else 16)
            return int(text, 10)

        Yaml12Loader.add_constructor("tag:yaml.org,2002:int", construct_int)

        def construct_mapping(loader, node, deep=False):  # a key written twice: refused (PyYAML keeps the last)
            seen = set()
            for key_node, _ in node.value:  # (merged keys, <<, may be overridden: only the written ones count)
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    if (key_node.tag, key_node.value) in seen:
                        raise yaml.constructor.ConstructorError(None, None, f"{short(key_node.value)} is given twice "
                                                                "in one mapping; keep one", key_node.start_mark)
                    seen.add((key_node.tag, key_node.value))
            return base.construct_mapping(loader, node, deep)

        Yaml12Loader.construct_mapping = construct_mapping
        _YAML_LOADER = Yaml12Loader
    return _YAML_LOADER


# -- fields ----------------------------------------------------------------------------
class Doc:
    """A value read from a file, and where it is: its checks name the file and the field.

    `source` is the file ("plan file p.json"), `path` the field ("stages[0].replicas[1].tp").
    """

    __slots__ = ("value", "source", "_path", "_parent", "_key")

    def __init__(self, value: Any, source: str, path: str = "", parent: "Doc | None" = None,
                 key: str | int | None = None):
        self.value, self.source, self._path, self._parent, self._key = value, source, path, parent, key

    @property
    def path(self) -> str:
        """Where the value is, e.g. stages[0].replicas[1].tp (worked out only for a message)."""
        if self._parent is None:
            return self._path
        return self._parent._sub(self._key)

    def _child(self, value: Any, key: str | int) -> "Doc":
        return Doc(value, self.source, parent=self, key=key)

    def fail(self, expected: str, hint: str = "") -> NoReturn:
        field = f"{self.path} " if self.path else "its top level "
        raise SailorError(f"{self.source}: {field}must be {expected}, not {short(self.value)}"
                          + (f"; {hint}" if hint else ""))

    def _sub(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else str(key)

    # -- containers ---------------------------------------------------------------------
    def fields(self, required: Iterable[str] = (), optional: Iterable[str] = (), hint: str = "",
               open_ended: bool = False) -> dict[str, "Doc"]:
        """An object with these keys: missing required ones and (unless open_ended) unknown ones are refused."""
        if not isinstance(self.value, dict):
            self.fail("an object {...}", hint)
        required, optional = tuple(required), tuple(optional)
        for key in required:
            if key not in self.value:
                raise SailorError(f"{self.source}: missing field {self._sub(key)!r}" + (f"; {hint}" if hint else ""))
        known = required + optional
        if not open_ended:
            for key in self.value:
                if key not in known:
                    raise SailorError(f"{self.source}: unknown field {self._sub(key)!r}{suggest(key, known)}; "
                                      f"known fields here: {', '.join(known)}")
        return {str(k): self._child(v, str(k)) for k, v in self.value.items()}

    def entries(self, hint: str = "") -> list[tuple[str, "Doc"]]:
        """An object with any keys: (key, value) pairs."""
        if not isinstance(self.value, dict):
            self.fail("an object {...}", hint)
        return [(str(k), self._child(v, str(k))) for k, v in self.value.items()]

    def items(self, min_len: int = 0, max_len: int | None = None, hint: str = "") -> list["Doc"]:
        if not isinstance(self.value, list):
            self.fail("a list [...]", hint)
        if len(self.value) < min_len:
            self.fail(f"a list of at least {min_len} entr{'y' if min_len == 1 else 'ies'}", hint)
        if max_len is not None and len(self.value) > max_len:
            raise SailorError(f"{self.source}: {self.path} has {len(self.value)} entries, more than the {max_len} "
                              "allowed" + (f"; {hint}" if hint else ""))
        return [self._child(v, i) for i, v in enumerate(self.value)]

    # -- scalars ---------------------------------------------------------------------------
    def int(self, lo: int | None = None, hi: int | None = None, hint: str = "") -> int:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
            self.fail(int_range(lo, hi), hint)
        return v

    def number(self, lo: float | None = None, hi: float | None = None, above: float | None = None,
               hint: str = "") -> float:
        """A finite number >= lo (or > above) and <= hi."""
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= FLOAT_MAX or \
                (lo is not None and v < lo) or (above is not None and v <= above) or (hi is not None and v > hi):
            self.fail(number_range(lo, hi, above), hint)
        return float(v)

    def str(self, choices: Iterable[str] | None = None, hint: str = "") -> str:
        v = self.value
        if choices is not None:
            choices = tuple(choices)
            if not isinstance(v, str) or v not in choices:
                self.fail(f"one of {', '.join(choices)}{suggest(v, choices) if isinstance(v, str) else ''}", hint)
            return v
        if not isinstance(v, str) or not v.strip():
            self.fail("a non-empty string", hint)
        if len(v) > 1000:
            self.fail("a string of at most 1000 characters", hint)
        if not v.isprintable():  # every string here is a name that tables and messages print
            self.fail("printable (no line breaks, tabs or control characters)", hint)
        return v

    def bool(self, hint: str = "") -> bool:
        if not isinstance(self.value, bool):
            self.fail("true or false", hint)
        return self.value

    def numbers(self, length: int | None = None, lo: float | None = 0.0, hi: float | None = None,
                hint: str = "") -> tuple[float, ...]:
        """A list of finite numbers in [lo, hi] (checked in bulk: profiles hold thousands)."""
        v = self.value
        if not isinstance(v, list) or (length is not None and len(v) != length):
            self.fail(f"a list of {length} numbers" if length is not None else "a list of numbers", hint)
        if {type(x) for x in v} <= {int, float}:  # the common case, checked in bulk (bool is neither)
            try:
                out = tuple(map(float, v))
            except OverflowError:  # an integer beyond any float: the loop below names it
                out = (math.nan,)
            if all(map(math.isfinite, out)) and (not out or ((lo is None or min(out) >= lo) and
                                                             (hi is None or max(out) <= hi))):
                return out
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not abs(x) <= FLOAT_MAX or \
                    (lo is not None and x < lo) or (hi is not None and x > hi):
                self._child(x, i).fail(number_range(lo, hi, None), hint)
        return tuple(float(x) for x in v)

    def ints(self, length: int | None = None, lo: int = 0, hi: int | None = None, hint: str = "") -> tuple[int, ...]:
        v = self.value
        if not isinstance(v, list) or (length is not None and len(v) != length):
            self.fail(f"a list of {length} integers" if length is not None else "a list of integers", hint)
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int) or x < lo or (hi is not None and x > hi):
                self._child(x, i).fail(int_range(lo, hi), hint)
        return tuple(v)


def is_int_key(key, lo: int, hi: int) -> bool:
    """Whether an object key writes an integer from lo to hi in ASCII digits (str.isdigit alone also
    takes '²', which int() refuses)."""
    return isinstance(key, str) and key.isascii() and key.isdigit() and lo <= int(key) <= hi


def int_key(key: str, source: str, where: "str | Doc", lo: int = 1, hi: int = MAX_BATCH) -> int:
    """An object key that stands for a number (a microbatch size, a TP degree, a layer index);
    `where` is the object (a Doc, whose path is worked out only for a message) or its name."""
    if not is_int_key(key, lo, hi):
        name = (where.path or "the top level") if isinstance(where, Doc) else where
        raise SailorError(f"{source}: {name} key {short(key)} must be {int_range(lo, hi)}")
    return int(key)


def int_range(lo: int | None, hi: int | None) -> str:
    if lo == 1 and hi is not None:
        return f"a positive integer up to {hi}"
    if lo is not None and hi is not None:
        return f"an integer from {lo} to {hi}"
    if lo is not None:
        return {0: "an integer >= 0", 1: "a positive integer"}.get(lo, f"an integer >= {lo}")
    return "an integer" if hi is None else f"an integer <= {hi}"


def number_range(lo: float | None, hi: float | None, above: float | None, below: float | None = None) -> str:
    low = f"> {above:g}" if above is not None else (f">= {lo:g}" if lo is not None else "")
    high = f"< {below:g}" if below is not None else (f"<= {hi:g}" if hi is not None else "")
    if above == 0:
        low = "positive"
    parts = [p for p in (low, high) if p]
    if low == "positive":
        return "a positive finite number" + (f" {high}" if high else "")
    return "a finite number" + (" " + " and ".join(parts) if parts else "")
