"""The job's durable state, so that the controller can die and a new one take over.

Every write to the job's store (store.py) also goes here before its client
hears OK: membership, fencing, epoch, plans, stop requests, checkpoint
reports, the event log (log/<n>). A controller restarted with the same state
(`sailor run --state ...`) loads it, serves the store again and re-adopts the
running job. Only one controller may lead a job at a time.

Two backends:

  * `Journal` (default, no set-up): an append-only file on the controller's
    machine, guarded by an fcntl lock (released by the kernel when the
    controller dies, so a restart takes over at once and a second live
    controller is refused). Each write is appended and flushed to the kernel
    before the reply: it survives the controller's death, and an fsync per
    controller decision covers the machine's too.
  * `etcd.EtcdState` (`--state etcd://HOST:PORT/JOB`): the same records in
    etcd, so a controller on another machine takes over (etcd.py).

Heartbeats (hb/, wb/) are not kept: they only matter while they change, and
a new controller times them from its own start.
"""
from __future__ import annotations

import fcntl
import os
import struct
import threading
from pathlib import Path
from typing import Callable

from planner.errors import SailorError

EPHEMERAL = (b"hb/", b"wb/")
_SET, _DEL = b"S", b"D"
_HEAD = struct.Struct("!cII")  # op, key length, value length
MAGIC = b"sailor-run journal 1\n"  # the first bytes of every journal: any other file is not ours to rewrite


def durable(key: bytes) -> bool:
    return not key.startswith(EPHEMERAL)


class Journal:
    """An append-only log of set/delete records; the newest value of each key wins."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.lock_path = Path(path + ".lock")
        self._lock_fd: int | None = None
        self._file = None
        self._mutex = threading.Lock()

    def describe(self) -> str:
        return f"journal {self.path}"

    # -- leadership ---------------------------------------------------------------------
    def lead(self) -> None:
        """Take the job's lock, or refuse in one line if another controller holds it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise SailorError(f"cannot open the job's journal lock {self.lock_path} ({e.strerror}); give --state a "
                              "writable path") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SailorError(f"another controller (pid {holder}) leads this job ({self.path} is locked); stop it "
                              "first, or give --state another file for another job") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    # -- records ------------------------------------------------------------------------
    def load(self) -> dict[bytes, bytes]:
        """The state as the last controller left it; rewrites the journal compactly."""
        data: dict[bytes, bytes] = {}
        raw = self.path.read_bytes() if self.path.exists() else b""
        i = journal_start(raw, self.path)
        while i + _HEAD.size <= len(raw):
            op, klen, vlen = _HEAD.unpack_from(raw, i)
            end = i + _HEAD.size + klen + vlen
            if end > len(raw) or op not in (_SET, _DEL):
                break  # a record torn by the crash: everything before it is whole
            key = raw[i + _HEAD.size: i + _HEAD.size + klen]
            if op == _SET:
                data[key] = raw[i + _HEAD.size + klen: end]
            else:
                data.pop(key, None)
            i = end
        self._rewrite(data)
        return data

    def reset(self) -> None:
        self._rewrite({})

    def _rewrite(self, data: dict[bytes, bytes]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            for k, v in data.items():
                f.write(_HEAD.pack(_SET, len(k), len(v)) + k + v)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self._file is not None:
            self._file.close()
        self._file = open(self.path, "ab")

    def put(self, key: bytes, value: bytes) -> Callable[[], None]:
        with self._mutex:
            self._file.write(_HEAD.pack(_SET, len(key), len(value)) + key + value)
            self._file.flush()
        return _done

    def delete(self, key: bytes) -> Callable[[], None]:
        with self._mutex:
            self._file.write(_HEAD.pack(_DEL, len(key), 0) + key)
            self._file.flush()
        return _done

    def sync(self) -> None:
        """Down to the disk: for the controller's own decisions (few, so the fsync is cheap)."""
        with self._mutex:
            os.fsync(self._file.fileno())

    def publish_address(self, address: str) -> None:
        pass  # agents reach a restarted controller on the same HOST:PORT (the journal keeps the port)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)


def journal_start(raw: bytes, path) -> int:
    """Where the records of journal bytes `raw` start; a non-empty file that is not a journal (a user's
    file, a cluster file given to --state by mistake) is refused, never rewritten."""
    if raw.startswith(MAGIC):
        return len(MAGIC)
    if not raw:
        return 0
    if len(raw) >= _HEAD.size:  # a journal of sailor before MAGIC: a whole first record with a readable key
        op, klen, _ = _HEAD.unpack_from(raw)
        key = raw[_HEAD.size:_HEAD.size + klen]
        if op in (_SET, _DEL) and 0 < klen == len(key) and key.isascii() and key.decode().isprintable():
            return 0
    raise SailorError(f"--state {path} exists and is not a sailor run journal; give a new file, or the --state of "
                      "an earlier run")


def check_journal(path: str) -> None:
    """Refuse --state FILE up front if FILE holds anything but a journal (journal_start)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SailorError(f"cannot read --state {path} ({e.strerror}); give a readable journal or a new file") from None
    journal_start(head, path)


def _done() -> None:
    pass


def open_state(spec: str):
    """A state backend from --state: a journal path, or etcd://HOST:PORT/JOB."""
    if spec.startswith("etcd://"):
        from planner.elastic.etcd import EtcdState

        return EtcdState.from_url(spec)
    return Journal(spec)


def locator(spec: str) -> Callable[[], tuple[str, int]]:
    """How an agent or worker finds the job's store: HOST:PORT, or the address the leading controller
    published in etcd (etcd://HOST:PORT/JOB), looked up again at every reconnection."""
    if spec.startswith("etcd://"):
        from planner.elastic.etcd import EtcdState

        return EtcdState.from_url(spec).find_address
    host, _, port = spec.rpartition(":")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise SailorError(f"bad --store {spec!r}: write HOST:PORT (a port from 1 to 65535) as printed by `sailor run`, "
                          "or etcd://HOST:PORT/JOB")
    address = (host or "127.0.0.1", int(port))
    return lambda: address
