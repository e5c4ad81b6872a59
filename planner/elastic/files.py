"""A node's checkpoint directory, served to the job's other nodes over HTTP.

With `--save node:NAME` checkpoints live on the nodes' own disks, not on a
filesystem they share: every rank writes its file under its agent's
--node-dir, and a copy goes to one other node, so losing any one node loses
no committed checkpoint (sailor_ext/storage.py, NodeStorage). The agent
serves its --node-dir with FileServer; workers reach other nodes' files with
FileClient. Torch-free.

Every request carries the node's token (header X-Sailor-Token), which the
agent publishes with its node's info in the controller's store; a request
without it is refused (403). Paths are relative to the served root and never
leave it. A write is atomic: a temporary file, fsync, rename, fsync of the
directory, so a reader sees the old file or the new one.

    GET    /rel          the file's bytes (a Range: bytes=a-b header is honoured); 404 if absent
    HEAD   /rel          its size (Content-Length); 404 if absent
    PUT    /rel          write it whole
    GET    /rel?list     JSON list of the names directly below rel ([] if none)
    DELETE /rel          remove the file, or everything below it
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit

TOKEN_HEADER = "X-Sailor-Token"
CHUNK = 1 << 20


def write_atomically(path: str, data: bytes | memoryview) -> None:
    """A local file, whole or not at all: a temporary name, fsync, rename, fsync of the directory
    (which some filesystems refuse; the rename is then as durable as they make it)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class FileServer:
    """Serves `root` on host:port (port 0: any free one) in a daemon thread."""

    def __init__(self, root: str, host: str = "", port: int = 0, token: str | None = None):
        self.root = os.path.realpath(root)
        os.makedirs(self.root, exist_ok=True)
        self.token = token or uuid.uuid4().hex
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the agent's log is for the job
                pass

            def _target(self) -> tuple[str, bool] | None:
                if self.headers.get(TOKEN_HEADER) != server.token:
                    self.send_error(403, "wrong or missing token")
                    return None
                parts = urlsplit(self.path)
                path = os.path.realpath(os.path.join(server.root, unquote(parts.path).lstrip("/")))
                if path != server.root and not path.startswith(server.root + os.sep):
                    self.send_error(400, "path outside the served directory")
                    return None
                return path, parts.query == "list"

            def do_HEAD(self) -> None:
                self._get(body=False)

            def do_GET(self) -> None:
                self._get(body=True)

            def _get(self, body: bool) -> None:
                got = self._target()
                if got is None:
                    return
                path, listing = got
                if listing:
                    names = sorted(n for n in os.listdir(path) if not n.endswith(".tmp")) \
                        if os.path.isdir(path) else []
                    data = json.dumps(names).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if body:
                        self.wfile.write(data)
                    return
                if not os.path.isfile(path):
                    self.send_error(404)
                    return
                size = os.path.getsize(path)
                start, stop = 0, size
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes="):
                    a, _, b = rng[len("bytes="):].partition("-")
                    start, stop = int(a or 0), min(size, int(b) + 1 if b else size)
                start = min(start, stop)
                self.send_response(206 if rng else 200)
                self.send_header("Content-Length", str(stop - start))
                self.end_headers()
                if body:
                    with open(path, "rb") as f:
                        f.seek(start)
                        left = stop - start
                        while left > 0 and (chunk := f.read(min(CHUNK, left))):
                            self.wfile.write(chunk)
                            left -= len(chunk)

            def do_PUT(self) -> None:
                got = self._target()
                if got is None:
                    return
                n = int(self.headers.get("Content-Length", "0"))
                data = self.rfile.read(n)
                if len(data) != n:
                    self.send_error(400, "short body")
                    return
                write_atomically(got[0], data)
                self.send_response(204)
                self.end_headers()

            def do_DELETE(self) -> None:
                got = self._target()
                if got is None:
                    return
                path = got[0]
                if os.path.isdir(path) and path != server.root:
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.isfile(path):
                    os.remove(path)
                self.send_response(204)
                self.end_headers()

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="file-server",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FileClient:
    """Another node's FileServer, below a prefix of its root. A node that does not answer raises OSError."""

    def __init__(self, url: str, token: str, prefix: str = "", timeout_s: float = 60.0):
        self.url, self.token, self.timeout_s = url.rstrip("/"), token, timeout_s
        self.prefix = prefix.strip("/")

    def _request(self, method: str, rel: str, data: bytes | None = None, headers: dict | None = None,
                 query: str = ""):
        path = "/".join(p for p in (self.prefix, rel.strip("/")) if p)
        req = urllib.request.Request(f"{self.url}/{quote(path)}{query}", data=data, method=method,
                                     headers={TOKEN_HEADER: self.token, **(headers or {})})
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise FileNotFoundError(f"{self.url}/{path}") from None
            raise OSError(f"{self.url}/{path}: HTTP {e.code} {e.reason}") from None

    def get(self, rel: str, start: int | None = None, stop: int | None = None) -> bytes:
        rng = {} if start is None and stop is None else \
            {"Range": f"bytes={start or 0}-{'' if stop is None else stop - 1}"}
        if stop is not None and stop <= (start or 0):
            return b""
        with self._request("GET", rel, headers=rng) as r:
            return r.read()

    def size(self, rel: str) -> int:
        with self._request("HEAD", rel) as r:
            return int(r.headers["Content-Length"])

    def put(self, rel: str, data: bytes) -> None:
        self._request("PUT", rel, data=bytes(data), headers={"Content-Type": "application/octet-stream"}).close()

    def children(self, rel: str = "") -> list[str]:
        with self._request("GET", rel, query="?list") as r:
            return json.loads(r.read())

    def remove(self, rel: str) -> None:
        self._request("DELETE", rel).close()
