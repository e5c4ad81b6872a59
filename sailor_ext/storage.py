"""Where checkpoints live: a local directory or any fsspec URL (s3://, gs://, ...).

Nodes of a geo-distributed job share no filesystem; they share an object
store. The checkpoint protocol (checkpoint.py) therefore needs only what an
object store gives: whole-object writes that are atomic (a reader sees the
old object or the new one, never half of one), ranged reads, listing and
deletion. No directory rename: on S3 that is a copy of every byte.

A local path keeps the POSIX guarantees on top: each file is written to a
temporary name, fsynced, renamed, and its directory fsynced.
"""
from __future__ import annotations

import os
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem

from planner.errors import SailorError


class Storage:
    """One checkpoint root (--save or --load): paths below it are 'a/b' strings."""

    def __init__(self, url: str | os.PathLike):
        self.url = str(url).rstrip("/") or "/"
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except (ImportError, ValueError) as e:  # e.g. s3:// without s3fs installed
            raise SailorError(f"cannot open checkpoint location {self.url}: {e}") from None
        self.local = isinstance(self.fs, LocalFileSystem)

    def where(self, *parts: str) -> str:
        """The path of `parts` as the user wrote the root (for messages)."""
        return "/".join([self.url, *parts])

    def _path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def put(self, rel: str, data: bytes | memoryview) -> None:
        """Write the object `rel` whole, atomically."""
        path = self._path(rel)
        if not self.local:
            self.fs.pipe_file(path, bytes(data))
            return
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(directory)

    def get(self, rel: str, start: int | None = None, stop: int | None = None) -> bytes:
        """Bytes [start, stop) of `rel` (the whole object by default); FileNotFoundError if absent."""
        path = self._path(rel)
        if self.local:
            with open(path, "rb") as f:
                if start:
                    f.seek(start)
                return f.read(-1 if stop is None else stop - (start or 0))
        return self.fs.cat_file(path, start=start, end=stop)

    def _fresh(self, path: str) -> str:
        """`path`, forgetting what fsspec cached of it: another node may have written since."""
        if not self.local:
            self.fs.invalidate_cache(path)
        return path

    def read_into(self, rel: str, start: int, buffer: memoryview) -> int:
        """Fill `buffer` with the bytes of `rel` from `start` (no extra copy on a local disk);
        returns how many there were."""
        if not self.local:
            data = self.get(rel, start, start + len(buffer))
            buffer[:len(data)] = data
            return len(data)
        with open(self._path(rel), "rb", buffering=0) as f:
            f.seek(start)
            done = 0
            while done < len(buffer) and (n := f.readinto(buffer[done:])):
                done += n
            return done

    def size(self, rel: str) -> int:
        return int(self.fs.size(self._fresh(self._path(rel))))

    def exists(self, rel: str = "") -> bool:
        return self.fs.exists(self._fresh(self._path(rel) if rel else self.root))

    def children(self, rel: str = "") -> list[str]:
        """Names directly below `rel` (objects and 'directories'); [] if there is none."""
        path = self._fresh(self._path(rel) if rel else self.root)
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def remove(self, rel: str) -> None:
        """Delete an object or everything below a prefix; missing is fine."""
        try:
            self.fs.rm(self._path(rel), recursive=True)
        except FileNotFoundError:
            pass


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
