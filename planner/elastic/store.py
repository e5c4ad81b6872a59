"""The job's key-value store, hosted by the controller (never on a training node).

Everything the elastic job agrees on goes through it: node membership, the
current plan and its epoch, which checkpoints exist, and the bootstrap of the
workers' process groups (the worker side wraps `StoreClient` as a
`torch.distributed.Store`, see sailor_ext/elastic/store.py). Because it lives
in the controller process, losing any training node never loses the store,
unlike torchrun's c10d store on the head node; and because every write also
goes to the job's durable state (state.py) before it is answered, losing the
controller does not lose it either: a new controller serves it again, and
clients given `locate` reconnect to it.

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

from planner.elastic.state import durable
from planner.errors import SailorError

SET, GET, ADD, CAS, CHECK, WAIT, DELETE, NUM_KEYS, KEYS, HELLO, PING = range(1, 12)
OK, TIMEOUT, MISSING, ERROR = range(4)
_U32 = struct.Struct("!I")
# A frame's largest length (bytes): far beyond any key, plan or event. A port that speaks another protocol
# fails here: an ASCII greeting's first 4 bytes read as 512 MiB or more ("SSH-" as 1.4 GB, then waited for).
MAX_FRAME = 256 << 20
FOREVER = -1.0


class StoreTimeout(TimeoutError):
    """A blocking get or wait did not see its keys in time."""


class StoreClosed(ConnectionError):
    """The store's connection dropped (and, for a client that reconnects, stayed down past its limit)."""


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
    if not 1 <= length <= MAX_FRAME:
        raise StoreClosed(f"a frame of {length} bytes: not the protocol of a sailor job's store")
    body = _recv_exact(sock, length)
    code, fields, i = body[0], [], 1
    while i < len(body):
        (n,) = _U32.unpack_from(body, i)
        fields.append(body[i + 4: i + 4 + n])
        i += 4 + n
    return code, fields


def _nothing() -> None:
    pass


def _b(x: str | bytes | int | float) -> bytes:
    if isinstance(x, bytes):
        return x
    return str(x).encode()


# -- server -------------------------------------------------------------------------
class KVState:
    """The data, a condition to wake blocked readers, and the disconnect hook."""

    def __init__(self, on_disconnect: Callable[[str], None] | None = None, durable=None,
                 data: dict[bytes, bytes] | None = None):
        self.data: dict[bytes, bytes] = dict(data or {})
        self.cond = threading.Condition()
        self.on_disconnect = on_disconnect
        self.durable = durable  # state.Journal or etcd.EtcdState: every write goes there too
        self.held: dict[str, int] = {}  # identity -> its open connections

    def hold(self, identity: str) -> None:
        with self.cond:
            self.held[identity] = self.held.get(identity, 0) + 1

    def release(self, identity: str) -> bool:
        """A connection of `identity` closed; True if it was the last. A process dies with all its
        connections, while a second process that took the same identity (a node id already in the job,
        refused) or a reconnection that beat the old socket's close leaves one open: not a loss."""
        with self.cond:
            left = self.held.get(identity, 0) - 1
            if left > 0:
                self.held[identity] = left
                return False
            self.held.pop(identity, None)
            return True

    def write(self, key: bytes, value: bytes | None) -> Callable[[], None]:
        """Apply a write (value None: delete); call with `cond` held. Returns what to call, without `cond`,
        before answering: it waits until the write is durable."""
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = value
            self.cond.notify_all()
        if self.durable is None or not durable(key):
            return _nothing
        return self.durable.put(key, value) if value is not None else self.durable.delete(key)

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
                if op == HELLO and f and f[0].decode(errors="replace") != identity:
                    if identity:
                        state.release(identity)
                    identity = f[0].decode(errors="replace")
                    state.hold(identity)
        except (StoreClosed, ConnectionError, OSError, SailorError):
            pass  # SailorError: the state refused the write (this controller was deposed)
        finally:
            if identity and state.release(identity) and state.on_disconnect and \
                    not getattr(self.server, "closing", False):
                state.on_disconnect(identity)

    @staticmethod
    def _serve(state: KVState, op: int, f: list[bytes]) -> bytes:
        data, cond = state.data, state.cond
        if op == SET:
            with cond:
                settle = state.write(f[0], f[1])
            settle()
            return _pack(OK, ())
        if op == GET:
            if not state.wait_for([f[0]], float(f[1])):
                return _pack(TIMEOUT, ())
            with cond:
                return _pack(OK, (data[f[0]],))
        if op == ADD:
            with cond:
                value = int(data.get(f[0], b"0")) + int(f[1])
                settle = state.write(f[0], _b(value))
            settle()
            return _pack(OK, (_b(value),))
        if op == CAS:  # torch's compare_set semantics
            key, expected, desired = f
            with cond:
                current = data.get(key)
                if not ((current is None and expected == b"") or current == expected):
                    return _pack(OK, (expected if current is None else current,))
                settle = state.write(key, desired)
            settle()
            return _pack(OK, (desired,))
        if op == CHECK:
            with cond:
                return _pack(OK, (b"1" if all(k in data for k in f) else b"0",))
        if op == WAIT:
            return _pack(OK if state.wait_for(f[1:], float(f[0])) else TIMEOUT, ())
        if op == DELETE:
            with cond:
                existed = f[0] in data
                settle = state.write(f[0], None) if existed else _nothing
            settle()
            return _pack(OK, (b"1" if existed else b"0",))
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
                 on_disconnect: Callable[[str], None] | None = None, durable=None,
                 data: dict[bytes, bytes] | None = None):
        self.state = KVState(on_disconnect, durable, data)
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

    # direct access for the controller, which lives in the same process; its writes are its
    # decisions, so they reach the disk (fsync) before anyone can act on them
    def _settle(self, settle: Callable[[], None], key: bytes) -> None:
        settle()
        if self.state.durable is not None and durable(key):
            self.state.durable.sync()

    def set(self, key: str, value: str | bytes) -> None:
        with self.state.cond:
            settle = self.state.write(_b(key), _b(value))
        self._settle(settle, _b(key))

    def get(self, key: str) -> bytes | None:
        with self.state.cond:
            return self.state.data.get(_b(key))

    def add(self, key: str, delta: int) -> int:
        with self.state.cond:
            value = int(self.state.data.get(_b(key), b"0")) + delta
            settle = self.state.write(_b(key), _b(value))
        self._settle(settle, _b(key))
        return value

    def delete(self, key: str) -> None:
        with self.state.cond:
            settle = self.state.write(_b(key), None) if _b(key) in self.state.data else _nothing
        self._settle(settle, _b(key))

    def keys(self, prefix: str) -> list[str]:
        with self.state.cond:
            return [k.decode() for k in self.state.data if k.startswith(_b(prefix))]


# -- client -------------------------------------------------------------------------
class StoreClient:
    """One connection to the store. Not thread-safe: one per thread that blocks on it."""

    def __init__(self, host: str, port: int, identity: str = "", connect_timeout: float = 10.0,
                 locate: Callable[[], tuple[str, int]] | None = None, say: Callable[[str], None] | None = None,
                 give_up_s: float = 0.0):
        """With `locate` (how to find the store again: state.locator), a dropped connection is
        re-established with backoff, for as long as it takes, and the call retried: the controller may
        die and a new one take over (give_up_s > 0: raise StoreClosed after that long). Without it a drop
        raises StoreClosed."""
        self.host, self.port, self.identity = host, port, identity
        self.locate, self.say, self.give_up_s = locate, say or (lambda line: None), give_up_s
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                if locate is not None:
                    self.host, self.port = locate()
                self.sock = self._connect(self.host, self.port, connect_timeout)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    where = f" at {self.host}:{self.port}" if self.port else ""
                    raise StoreClosed(f"cannot reach the job's store{where} ({e})") from None
                time.sleep(0.05)
        self._lock = threading.Lock()

    def _connect(self, host: str, port: int, timeout: float) -> socket.socket:
        """A connection that has introduced itself (hello with the identity, else a ping) and been answered
        within `timeout`: a port that is not a sailor job's store fails here, where it hung the caller."""
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(_pack(HELLO, [_b(self.identity)]) if self.identity else _pack(PING, ()))
            status, _ = _recv_frame(sock)
            if status != OK:
                raise StoreClosed(f"status {status} to a greeting: not a sailor job's store")
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return sock

    def _reconnect(self, why: OSError) -> None:
        """Back off 0.05 s doubling to 1 s between attempts, for as long as the caller waits for a controller."""
        self.say(f"lost the job's store at {self.host}:{self.port} ({why}); reconnecting")
        self.close()
        delay, t0 = 0.05, time.monotonic()
        while True:
            if self.give_up_s and time.monotonic() - t0 > self.give_up_s:
                raise StoreClosed(f"no store at {self.host}:{self.port} for {self.give_up_s:g} s")
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            try:
                self.host, self.port = self.locate()
                sock = self._connect(self.host, self.port, 2.0)
            except OSError:
                continue
            self.sock = sock
            self.say(f"reconnected to the job's store at {self.host}:{self.port} after {time.monotonic() - t0:.1f} s")
            return

    def _call(self, op: int, *fields) -> tuple[int, list[bytes]]:
        with self._lock:
            while True:
                try:
                    self.sock.sendall(_pack(op, [_b(x) for x in fields]))
                    status, out = _recv_frame(self.sock)
                    break
                except OSError as e:
                    if self.locate is None:
                        raise StoreClosed(f"lost the job's store at {self.host}:{self.port} ({e})") from None
                    self._reconnect(e)
        if status == ERROR:
            raise RuntimeError(out[0].decode())
        return status, out

    def reachable(self, timeout: float = 0.2) -> bool:
        """Whether the store answers now: one round trip, or one connection attempt (no backoff) if the
        connection is down. For a caller that must not wait for a controller to come back."""
        with self._lock:
            try:
                self.sock.sendall(_pack(PING, ()))
                _recv_frame(self.sock)
                return True
            except OSError:
                pass
            if self.locate is None:
                return False
            try:
                self.close()
                self.host, self.port = self.locate()
                sock = self._connect(self.host, self.port, timeout)
            except OSError:
                return False
            self.sock = sock
            return True

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
