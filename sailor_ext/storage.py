"""Where checkpoints live: a local directory, any fsspec URL (s3://, gs://, ...), or the nodes'
own disks (node:NAME, NodeStorage below).

Nodes of a geo-distributed job share no filesystem; they share an object
store. The checkpoint protocol (checkpoint.py) therefore needs only what an
object store gives: whole-object writes that are atomic (a reader sees the
old object or the new one, never half of one), ranged reads, listing and
deletion. No directory rename: on S3 that is a copy of every byte.

A local path keeps the POSIX guarantees on top: each file is written to a
temporary name, fsynced, renamed, and its directory fsynced.

node:NAME (elastic jobs, `sailor run`): no shared store at all. Each node
keeps NAME below its agent's --node-dir; a file written there is written to
one other node too (the next in the job's node order: its buddy) before the
write returns, so every committed file is on two nodes and losing any one
node loses nothing committed. Reads look on this node first, then ask the
other nodes (planner/elastic/files.py serves each --node-dir). Listing is
the union over the nodes that answer; removal goes to all of them.
"""
from __future__ import annotations

import os

import fsspec
from fsspec.implementations.local import LocalFileSystem

from planner.elastic.files import FileClient, write_atomically
from planner.errors import SailorError


NODE_SCHEME = "node:"


class NotAFile(OSError):
    """A path that is neither a file, a directory nor absent (a FIFO, a socket, a device): reading it could wait for
    a writer for ever. Checkpoint reading treats it as a damaged file."""

_NODES: dict = {}  # this process's node: its --node-dir, the other nodes' file clients, its buddy (configure_nodes)


def configure_nodes(node_dir: str, peers: list, buddy: int | None) -> None:
    """Where node:NAME lives for this worker: its node's directory, the other live nodes as (url, token)
    (job order), and which of them gets a copy of every file written here (None: no other node)."""
    _NODES.clear()
    _NODES.update(node_dir=node_dir, peers=list(peers), buddy=buddy)


def open_storage(url: str | os.PathLike) -> "Storage":
    """A checkpoint root: node:NAME on the nodes' own disks, else a local path or fsspec URL."""
    return NodeStorage(str(url)) if str(url).startswith(NODE_SCHEME) else Storage(url)


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
        write_atomically(path, data)

    def get(self, rel: str, start: int | None = None, stop: int | None = None) -> bytes:
        """Bytes [start, stop) of `rel` (the whole object by default); FileNotFoundError if absent."""
        path = self._path(rel)
        if self.local:
            if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
                raise NotAFile(f"{path} is a FIFO, socket or device, not a file")  # (reading it could wait for ever)
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


class NodeStorage(Storage):
    """node:NAME: this node's NAME below its --node-dir, with a copy of each file on its buddy (Storage's
    interface, every method its own)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        name = self.url[len(NODE_SCHEME):].strip("/")
        if not name or ".." in name.split("/"):
            raise SailorError(f"checkpoint location {url}: give node:NAME, a directory name below each node's "
                              "--node-dir")
        if not _NODES:
            raise SailorError(f"--save {url} keeps checkpoints on the nodes' own disks: it needs an elastic job "
                              "(`sailor run`) whose agents were started with --node-dir DIR")
        self.here = Storage(os.path.join(_NODES["node_dir"], name))
        self.local = False
        self.peers = [FileClient(u, token, name) for u, token in _NODES["peers"]]
        self.buddy = self.peers[_NODES["buddy"]] if _NODES["buddy"] is not None else None

    def where(self, *parts: str) -> str:
        return "/".join([self.url, *parts])

    def _first(self, what):
        """what(source) from this node, else from the first other node that has it."""
        for source in (self.here, *self.peers):
            try:
                return what(source)
            except FileNotFoundError:
                continue
            except OSError:  # a node that does not answer (lost) holds nothing we can read
                continue
        raise FileNotFoundError

    def put(self, rel: str, data: bytes | memoryview) -> None:
        self.here.put(rel, data)
        if self.buddy is not None:
            try:
                self.buddy.put(rel, bytes(data))
            except OSError as e:
                raise OSError(f"{self.where(rel)}: its copy on another node failed ({e})") from None

    def get(self, rel: str, start: int | None = None, stop: int | None = None) -> bytes:
        try:
            return self._first(lambda s: s.get(rel, start, stop))
        except FileNotFoundError:
            raise FileNotFoundError(self.where(rel)) from None

    def read_into(self, rel: str, start: int, buffer: memoryview) -> int:
        if os.path.isfile(self.here._path(rel)):
            return self.here.read_into(rel, start, buffer)
        data = self.get(rel, start, start + len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def size(self, rel: str) -> int:
        try:
            return self._first(lambda s: s.size(rel))
        except FileNotFoundError:
            raise FileNotFoundError(self.where(rel)) from None

    def exists(self, rel: str = "") -> bool:
        if not rel:
            return bool(self.children())
        try:
            self.size(rel)
            return True
        except FileNotFoundError:
            return False

    def children(self, rel: str = "") -> list[str]:
        names = set(self.here.children(rel))
        for peer in self.peers:
            try:
                names.update(peer.children(rel))
            except OSError:
                pass
        return sorted(names)

    def remove(self, rel: str) -> None:
        self.here.remove(rel)
        for peer in self.peers:
            try:
                peer.remove(rel)
            except OSError:
                pass
