"""The job's durable state in etcd, so a controller on another machine can take over.

    sailor run --state etcd://10.0.0.5:2379/myjob ...
    sailor agent --store etcd://10.0.0.5:2379/myjob ...

Talks to etcd's v3 HTTP/JSON gateway with the standard library (keys and
values travel base64-encoded). Under the prefix sailor/<job>/:

    kv/<key>     the job's store, as state.Journal keeps it
    leader       the leading controller's id, on a lease it keeps alive
    address      HOST:PORT of the leader's store, where agents and workers
                 (re)connect

Leadership: a controller creates `leader` on its lease only if the key does
not exist (a txn on create_revision 0). A live leader keeps its lease alive
every TTL/3 s; a dead one's lease expires after TTL s and the key goes with
it. A new controller waits up to TTL + 1 s for that, then is refused with one
line. Every write is a txn conditioned on `leader` still naming this
controller, so a deposed one can never write; it exits when its lease is lost.

Writes are group-committed: store threads queue them and wait; one thread
sends whatever has queued as one txn (at most MAX_OPS keys, the last value of
a key wins within it), so N clients writing at once cost one round trip.
"""
from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Callable
from urllib.parse import urlparse

from planner.errors import SailorError

LEASE_TTL_S = 3
MAX_OPS = 100  # etcd allows 128 operations per txn by default


def _b64(x: bytes) -> str:
    return base64.b64encode(x).decode()


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdError(ConnectionError):
    pass


class EtcdState:
    def __init__(self, endpoint: str, job: str):
        self.endpoint, self.job = endpoint.rstrip("/"), job
        self.root = f"sailor/{job}/".encode()
        self.id = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease: str | None = None
        self.lost: str | None = None  # why this controller no longer leads
        self._queue: list[tuple[bytes, bytes | None, threading.Event]] = []
        self._cond = threading.Condition()
        self._closed = False

    @staticmethod
    def from_url(url: str) -> "EtcdState":
        u = urlparse(url)
        job = u.path.strip("/")
        if not u.hostname or not u.port or not job or "/" in job:
            raise SailorError(f"bad etcd address {url!r}: write etcd://HOST:PORT/JOB (JOB names the job, no '/')")
        return EtcdState(f"http://{u.hostname}:{u.port}", job)

    def describe(self) -> str:
        return f"etcd {self.endpoint} job {self.job}"

    # -- HTTP ---------------------------------------------------------------------------
    def _post(self, path: str, body: dict, timeout: float = 5.0) -> dict:
        req = urllib.request.Request(self.endpoint + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise EtcdError(f"etcd at {self.endpoint}: {getattr(e, 'reason', e)}") from None

    def _key(self, name: bytes) -> str:
        return _b64(self.root + name)

    def _range(self, name: bytes, prefix: bool = False) -> list[dict]:
        body = {"key": self._key(name)}
        if prefix:
            body["range_end"] = _b64(_prefix_end(self.root + name))
            body["sort_target"], body["sort_order"] = "CREATE", "ASCEND"  # the order keys were first written
        return self._post("/v3/kv/range", body).get("kvs", [])

    # -- leadership ---------------------------------------------------------------------
    def lead(self) -> None:
        try:
            self.lease = self._post("/v3/lease/grant", {"TTL": LEASE_TTL_S})["ID"]
            deadline = time.monotonic() + LEASE_TTL_S + 1.0
            while True:
                got = self._post("/v3/kv/txn", {
                    "compare": [{"key": self._key(b"leader"), "result": "EQUAL", "target": "CREATE",
                                 "create_revision": "0"}],
                    "success": [{"request_put": {"key": self._key(b"leader"), "value": _b64(self.id.encode()),
                                                 "lease": self.lease}}],
                    "failure": [{"request_range": {"key": self._key(b"leader")}}]})
                if got.get("succeeded"):
                    break
                if time.monotonic() > deadline:
                    kvs = got["responses"][0]["response_range"].get("kvs", [])
                    holder = base64.b64decode(kvs[0]["value"]).decode() if kvs else "?"
                    raise SailorError(f"another controller ({holder}) leads job {self.job!r} in etcd {self.endpoint}; "
                                      "stop it first, or give --state another job name")
                time.sleep(0.1)
                self._post("/v3/lease/keepalive", {"ID": self.lease})  # ours must outlive the wait
        except EtcdError as e:
            raise SailorError(f"cannot use the job's state: {e}; start etcd or fix --state") from None
        threading.Thread(target=self._keep_alive, name="etcd-lease", daemon=True).start()
        threading.Thread(target=self._writer, name="etcd-writer", daemon=True).start()

    def _keep_alive(self) -> None:
        last_ok = time.monotonic()
        while not self._closed:
            time.sleep(LEASE_TTL_S / 3)
            try:
                ttl = int(self._post("/v3/lease/keepalive", {"ID": self.lease}, 1.0).get("result", {})
                          .get("TTL", 0))
                if ttl <= 0:
                    self._lose("its etcd lease expired")
                    return
                last_ok = time.monotonic()
            except EtcdError:
                if time.monotonic() - last_ok > LEASE_TTL_S:
                    self._lose("etcd did not answer for a lease period")
                    return

    def _lose(self, why: str) -> None:
        with self._cond:
            self.lost = self.lost or why
            self._cond.notify_all()

    # -- records ------------------------------------------------------------------------
    def load(self) -> dict[bytes, bytes]:
        try:
            kvs = self._range(b"kv/", prefix=True)
        except EtcdError as e:
            raise SailorError(f"cannot read the job's state: {e}") from None
        skip = len(self.root) + 3
        return {base64.b64decode(kv["key"])[skip:]: base64.b64decode(kv.get("value", "")) for kv in kvs}

    def reset(self) -> None:
        prefix = self.root + b"kv/"
        self._post("/v3/kv/deleterange", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})

    def put(self, key: bytes, value: bytes) -> Callable[[], None]:
        return self._submit(b"kv/" + key, value)

    def delete(self, key: bytes) -> Callable[[], None]:
        return self._submit(b"kv/" + key, None)

    def _submit(self, key: bytes, value: bytes | None) -> Callable[[], None]:
        done = threading.Event()
        with self._cond:
            self._queue.append((key, value, done))
            self._cond.notify_all()

        def wait() -> None:
            while not done.wait(0.5):
                if self.lost:
                    break
            if self.lost:
                raise SailorError(f"this controller no longer leads the job: {self.lost}")
        return wait

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed and not self.lost:
                    self._cond.wait()
                if self.lost or (self._closed and not self._queue):
                    return
                batch, ops = [], {}
                while self._queue and (len(ops) < MAX_OPS or self._queue[0][0] in ops):
                    key, value, done = self._queue.pop(0)
                    ops[key] = value
                    batch.append(done)
            requests = [{"request_put": {"key": self._key(k), "value": _b64(v)}} if v is not None else
                        {"request_delete_range": {"key": self._key(k)}} for k, v in ops.items()]
            for attempt in range(50):
                try:
                    got = self._post("/v3/kv/txn", {
                        "compare": [{"key": self._key(b"leader"), "result": "EQUAL", "target": "VALUE",
                                     "value": _b64(self.id.encode())}], "success": requests})
                    if not got.get("succeeded"):
                        self._lose("another controller took the job over")
                        return
                    break
                except EtcdError:
                    time.sleep(0.1)
            else:
                self._lose("etcd did not take the job's writes for 5 s")
                return
            for done in batch:
                done.set()

    def sync(self) -> None:
        pass  # every write already waited for etcd's commit (etcd fsyncs its log)

    def publish_address(self, address: str) -> None:
        self._submit(b"address", address.encode())()

    def find_address(self) -> tuple[str, int]:
        """HOST:PORT of the leading controller's store (EtcdError while none has published one)."""
        kvs = self._range(b"address")
        if not kvs:
            raise EtcdError(f"no controller has published job {self.job!r} in etcd {self.endpoint}")
        host, _, port = base64.b64decode(kvs[0]["value"]).decode().rpartition(":")
        return host, int(port)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
