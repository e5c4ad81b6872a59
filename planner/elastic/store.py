"""The job's key-value store, hosted by the controller (never on a training node).

Everything the elastic job agrees on goes through it: node membership, the
current plan and its epoch, which checkpoints exist, and the bootstrap of the
workers' process groups (the worker side wraps `StoreClient` as a
`torch.distributed.Store`, see sailor_ext/elastic/store.py). Because it lives
in the controller process, losing any training node never loses the store,
unlike torchrun's c10d store on the head node.

It is a plain threaded TCP server (one thread per connection; jobs have tens
of connections) speaking a small length-prefixed protocol, so the controller
needs no torch. A connection may introduce itself (`hello`); when it drops,
the server reports the identity to `on_disconnect`: a process that dies is
noticed in milliseconds, without waiting for a heartbeat to expire.

Wire format: a frame is a u32 length followed by the payload; a payload is a
one-byte opcode (requests) or status (responses) and fields, each a u32
length and bytes. Integers travel as ASCII decimals.
"""
from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from typing import Callable, Iterable

from planner.errors import SailorError

SET, GET, ADD, CAS, CHECK, WAIT, DELETE, NUM_KEYS, KEYS, HELLO, PING = range(1, 12)
OK, TIMEOUT, MISSING, ERROR = range(4)
_U32 = struct.Struct("!I")
FOREVER = -1.0


class StoreTimeout(TimeoutError):
    """A blocking get or wait did not see its keys in time."""


class StoreClosed(ConnectionError):
    """The store's connection dropped: the controller is gone."""


def _pack(code: int, fields: Iterable[bytes]) -> bytes:
    body = bytes([code]) + b"".join(_U32.pack(len(f)) + f for f in fields)
    return _U32.pack(len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise StoreClosed("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket) -> tuple[int, list[bytes]]:
    (length,) = _U32.unpack(_recv_exact(sock, 4))
    body = _recv_exact(sock, length)
    code, fields, i = body[0], [], 1
    while i < len(body):
        (n,) = _U32.unpack_from(body, i)
        fields.append(body[i + 4: i + 4 + n])
        i += 4 + n
    return code, fields


def _b(x: str | bytes | int | float) -> bytes:
    if isinstance(x, bytes):
        return x
    return str(x).encode()


# -- server -------------------------------------------------------------------------
class KVState:
    """The data, a condition to wake blocked readers, and the disconnect hook."""

    def __init__(self, on_disconnect: Callable[[str], None] | None = None):
        self.data: dict[bytes, bytes] = {}
        self.cond = threading.Condition()
        self.on_disconnect = on_disconnect

    def wait_for(self, keys: list[bytes], timeout: float) -> bool:
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self.cond:
            while not all(k in self.data for k in keys):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
            return True


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        state: KVState = self.server.state  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        identity = ""
        try:
            while True:
                op, f = _recv_frame(sock)
                sock.sendall(self._serve(state, op, f))
                if op == HELLO:
                    identity = f[0].decode()
        except (StoreClosed, ConnectionError, OSError):
            pass
        finally:
            if identity and state.on_disconnect and not getattr(self.server, "closing", False):
                state.on_disconnect(identity)

    @staticmethod
    def _serve(state: KVState, op: int, f: list[bytes]) -> bytes:
        data, cond = state.data, state.cond
        if op == SET:
            with cond:
                data[f[0]] = f[1]
                cond.notify_all()
            return _pack(OK, ())
        if op == GET:
            if not state.wait_for([f[0]], float(f[1])):
                return _pack(TIMEOUT, ())
            with cond:
                return _pack(OK, (data[f[0]],))
        if op == ADD:
            with cond:
                value = int(data.get(f[0], b"0")) + int(f[1])
                data[f[0]] = _b(value)
                cond.notify_all()
            return _pack(OK, (_b(value),))
        if op == CAS:  # torch's compare_set semantics
            key, expected, desired = f
            with cond:
                current = data.get(key)
                if (current is None and expected == b"") or current == expected:
                    data[key] = desired
                    cond.notify_all()
                    return _pack(OK, (desired,))
                return _pack(OK, (expected if current is None else current,))
        if op == CHECK:
            with cond:
                return _pack(OK, (b"1" if all(k in data for k in f) else b"0",))
        if op == WAIT:
            return _pack(OK if state.wait_for(f[1:], float(f[0])) else TIMEOUT, ())
        if op == DELETE:
            with cond:
                return _pack(OK, (b"1" if data.pop(f[0], None) is not None else b"0",))
        if op == NUM_KEYS:
            with cond:
                return _pack(OK, (_b(len(data)),))
        if op == KEYS:
            with cond:
                return _pack(OK, tuple(k for k in data if k.startswith(f[0])))
        if op in (HELLO, PING):
            return _pack(OK, ())
        return _pack(ERROR, (b"unknown opcode %d" % op,))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class StoreServer:
    """The store, served on a TCP port from background threads of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 on_disconnect: Callable[[str], None] | None = None):
        self.state = KVState(on_disconnect)
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as e:
            raise SailorError(f"cannot serve the job's store on {host}:{port} ({e.strerror}); "
                              "pick another --port or free it") from None
        self._server.state = self.state  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="store", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._server.closing = True  # type: ignore[attr-defined]
        self._server.shutdown()
        self._server.server_close()

    # direct access for the controller, which lives in the same process
    def set(self, key: str, value: str | bytes) -> None:
        with self.state.cond:
            self.state.data[_b(key)] = _b(value)
            self.state.cond.notify_all()

    def get(self, key: str) -> bytes | None:
        with self.state.cond:
            return self.state.data.get(_b(key))

    def add(self, key: str, delta: int) -> int:
        with self.state.cond:
            value = int(self.state.data.get(_b(key), b"0")) + delta
            self.state.data[_b(key)] = _b(value)
            self.state.cond.notify_all()
            return value

    def delete(self, key: str) -> None:
        with self.state.cond:
            self.state.data.pop(_b(key), None)

    def keys(self, prefix: str) -> list[str]:
        with self.state.cond:
            return [k.decode() for k in self.state.data if k.startswith(_b(prefix))]


# -- client -------------------------------------------------------------------------
class StoreClient:
    """One connection to the store. Not thread-safe: one per thread that blocks on it."""

    def __init__(self, host: str, port: int, identity: str = "", connect_timeout: float = 10.0):
        self.host, self.port, self.identity = host, port, identity
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=connect_timeout)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise StoreClosed(f"cannot reach the job's store at {host}:{port} ({e})") from None
                time.sleep(0.05)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()
        if identity:
            self._call(HELLO, identity)

    def _call(self, op: int, *fields) -> tuple[int, list[bytes]]:
        with self._lock:
            try:
                self.sock.sendall(_pack(op, [_b(x) for x in fields]))
                status, out = _recv_frame(self.sock)
            except OSError as e:
                raise StoreClosed(f"lost the job's store at {self.host}:{self.port} ({e})") from None
        if status == ERROR:
            raise RuntimeError(out[0].decode())
        return status, out

    def set(self, key: str, value: str | bytes) -> None:
        self._call(SET, key, value)

    def get(self, key: str, timeout: float = FOREVER) -> bytes:
        """The value of `key`, waiting up to `timeout` seconds for it to appear."""
        status, out = self._call(GET, key, timeout)
        if status == TIMEOUT:
            raise StoreTimeout(f"key {key!r} not set within {timeout:g} s")
        return out[0]

    def try_get(self, key: str) -> bytes | None:
        try:
            return self.get(key, 0.0)
        except StoreTimeout:
            return None

    def add(self, key: str, delta: int) -> int:
        return int(self._call(ADD, key, delta)[1][0])

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self._call(CAS, key, expected, desired)[1][0]

    def check(self, keys: list[str]) -> bool:
        return self._call(CHECK, *keys)[1][0] == b"1"

    def wait(self, keys: list[str], timeout: float = FOREVER) -> None:
        status, _ = self._call(WAIT, timeout, *keys)
        if status == TIMEOUT:
            raise StoreTimeout(f"keys {keys} not set within {timeout:g} s")

    def delete(self, key: str) -> bool:
        return self._call(DELETE, key)[1][0] == b"1"

    def num_keys(self) -> int:
        return int(self._call(NUM_KEYS)[1][0])

    def keys(self, prefix: str) -> list[str]:
        return [k.decode() for k in self._call(KEYS, prefix)[1]]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
