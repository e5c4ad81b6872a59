"""Where sailor writes: atomically, and never over what it reads.

An output goes to a temporary file beside its destination and is renamed over
it once complete, so a failed or interrupted write leaves the previous file
as it was. An output that names one of the command's inputs (the plan being
launched, the cluster file, a config.json) is refused before anything runs.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from planner.errors import SailorError


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _inside(path: Path, directory: Path) -> bool:
    try:
        return directory.is_dir() and directory.resolve() in path.resolve().parents
    except OSError:
        return False


def check_output(path: str | Path, inputs: Iterable[str | Path | None] = (), what: str = "output",
                 replaced: bool = True) -> Path:
    """`path` as a place to write `what`: not an input (nor a file inside an input directory), not a
    directory, in a directory that exists. replaced: the output is renamed over `path` (atomic_path), so
    `path` may not be a device, pipe or socket either: as root the rename put a file in /dev/null's place."""
    if str(path) == "-":  # (it wrote a file named "-" where standard output was meant)
        raise SailorError(f"{what} '-': sailor writes it to a file, not to standard output; give a file name")
    if str(path).endswith("/"):  # (Path drops the slash: x.json/ wrote x.json)
        raise SailorError(f"{what} {path} ends in '/', a directory; give a file name")
    out = Path(path)
    for given in inputs:
        if given is None:
            continue
        if _same(out, Path(given)):
            raise SailorError(f"{what} {path} is also an input of this command; write it to another file")
        if out.exists() and _inside(out, Path(given)):
            raise SailorError(f"{what} {path} would replace a file in {given}, an input of this command; write it "
                              "elsewhere")
    if out.is_dir():
        raise SailorError(f"{what} {path} is a directory; give a file name")
    if replaced and out.exists() and not out.is_file():
        raise SailorError(f"{what} {path} is a device, pipe or socket, and writing it would put a file in its place; "
                          "give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise SailorError(f"cannot write {what} {path}: directory {parent} does not exist; create it first")
    return out


@contextlib.contextmanager
def atomic_path(path: str | Path, inputs: Iterable[str | Path | None] = (), what: str = "output") -> Iterator[Path]:
    """A temporary path to write `path` through (same directory and extension); renamed over it on success.

    Its name is short whatever the output's (a name near the file system's 255-byte limit stays
    writable) and ends in the output's extension, ".png" included (matplotlib picks the format by it);
    errors on it name the output, not the temporary file."""
    out = check_output(path, inputs, what)
    ext = os.path.splitext("x" + out.name)[1]  # (".png" of a file named ".png" too)
    tag = hashlib.sha1(out.name.encode(errors="surrogateescape")).hexdigest()[:8]
    tmp = out.with_name(f".sailor-{tag}.{os.getpid()}.tmp{ext if len(ext) <= 16 else ''}")
    try:
        yield tmp
        os.replace(tmp, out)
    except PermissionError:
        raise SailorError(f"cannot write {what} {path}: permission denied") from None
    except OSError as e:
        if e.filename not in (str(tmp), str(out)):
            raise
        raise SailorError(f"cannot write {what} {path} ({e.strerror or e}); give a file in a writable directory") \
            from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def append_record(file, record: dict, what: str, hint: str) -> None:
    """One JSON line appended to an open file and flushed (metrics, events): a full disk or a failing device
    is one line naming `what`, not an OSError from deep inside a run."""
    try:
        file.write(json.dumps(record) + "\n")
        file.flush()
    except OSError as e:
        raise SailorError(f"cannot write {what} ({e.strerror or e}); {hint}") from None


def write_output(path: str | Path, content: str | bytes, inputs: Iterable[str | Path | None] = (),
                 what: str = "output") -> Path:
    """Write `content` to `path` atomically, refusing to replace any of `inputs`."""
    with atomic_path(path, inputs, what) as tmp:
        if isinstance(content, str):
            tmp.write_text(content, encoding="utf-8")
        else:
            tmp.write_bytes(content)
    return Path(path)
