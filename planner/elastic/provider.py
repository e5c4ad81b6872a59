"""The provider hook of an elastic job: the node ids the cloud says exist.

`sailor run --nodes-file FILE` (a list the cloud's tooling rewrites) or
`--nodes-command CMD` (a command that asks the cloud's API) names the hook; it
prints one id per line or a JSON list of strings. The controller drains out a
node the hook stops listing, before the cloud reclaims it.

The hook is asked on a thread of its own (ProviderWatch): a cloud API may take
seconds to answer, or hang until the 10 s timeout, and the controller's loop,
which notices lost nodes within a heartbeat, must not wait on it.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from planner.errors import SailorError

MAX_PROVIDER_BYTES = 64 << 20
MAX_PROVIDER_IDS = 1 << 16  # nodes: beyond any job's
COMMAND_TIMEOUT_S = 10.0


def describe(path: str | None, command: str | None) -> str:
    """The hook as the user gave it, for messages."""
    return f"--nodes-file {path}" if path else f"--nodes-command {command!r}"


def _run(command: str, started: Callable[[subprocess.Popen], None] | None = None) -> bytes:
    """The command's standard output. It runs in a session of its own, and on a timeout its whole
    process group is killed (a shell's children too)."""
    with subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as proc:
        if started is not None:
            started(proc)
        try:
            out, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            raise
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command, out, err)
    return out


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already
        pass


def _read(path: str | None, command: str | None, started=None) -> set[str]:
    """Node ids the provider reports. Raises OSError, SubprocessError or ValueError (not a regular file,
    not UTF-8, bad JSON, an unparsable command, too long) when the hook cannot be read."""
    if path:
        if not stat.S_ISREG(os.stat(path).st_mode):  # (a pipe blocked the controller, /dev/zero filled memory)
            raise ValueError("not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_PROVIDER_BYTES + 1)
    else:
        data = _run(command, started)
    if len(data) > MAX_PROVIDER_BYTES:
        raise ValueError(f"longer than {MAX_PROVIDER_BYTES >> 20} MiB")
    text = data.decode("utf-8").lstrip("\ufeff").strip()  # (an editor's byte-order mark)
    if text.startswith("["):
        try:
            ids = json.loads(text)
        except RecursionError:
            raise ValueError("a JSON list nested too deeply") from None
        if not isinstance(ids, list) or not all(isinstance(x, str) and x for x in ids):
            raise ValueError("a JSON list that is not of node id strings")
    else:
        ids = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(ids) > MAX_PROVIDER_IDS:
        raise ValueError(f"more than {MAX_PROVIDER_IDS} node ids")
    return set(ids)


def _why(e: Exception) -> str:
    """What went wrong reading the hook, in a few words."""
    if isinstance(e, subprocess.CalledProcessError):
        err = e.stderr.decode("utf-8", "replace").strip() if e.stderr else ""
        return f"exit {e.returncode}" + (f": {err.splitlines()[-1][:200]}" if err else "")
    if isinstance(e, subprocess.TimeoutExpired):
        return f"no answer within {e.timeout:g} s"
    if isinstance(e, UnicodeDecodeError):
        return "not UTF-8 text"
    return getattr(e, "strerror", None) or str(e)


@dataclass(frozen=True)
class Answer:
    """One poll of the hook: the ids it lists, or why it could not be read (then the last list stands)."""

    ids: frozenset[str] | None
    why: str = ""


def ask(path: str | None, command: str | None, started=None) -> Answer:
    """One poll (started: called with the command's process once it runs)."""
    try:
        return Answer(frozenset(_read(path, command, started)))
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return Answer(None, _why(e))


def check_provider(path: str | None, command: str | None) -> None:
    """Read the hook once before the job starts: a typo in it would silently never notice a node's loss."""
    answer = ask(path, command)
    if answer.ids is None:
        raise SailorError(f"{describe(path, command)} cannot be read at start ({answer.why}); it must list the ids "
                          "of the nodes that exist, one per line or as a JSON list")


class ProviderWatch:
    """Asks the hook every `interval_s` (back to back when it is slower) on a daemon thread; the
    controller takes each new answer once (take), without waiting."""

    def __init__(self, path: str | None, command: str | None, interval_s: float):
        self.path, self.command, self.interval_s = path, command, interval_s
        self._lock = threading.Lock()
        self._answer: Answer | None = None  # the newest answer not yet taken
        self._proc: subprocess.Popen | None = None  # the command asking now
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sailor-provider", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            answer = ask(self.path, self.command, self._started)
            with self._lock:
                self._answer = answer
            self._stopped.wait(self.interval_s)

    def _started(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._proc = proc
        if self._stopped.is_set():  # closed while it started
            _kill(proc)

    def take(self) -> Answer | None:
        """The newest answer since the last take, or None."""
        with self._lock:
            answer, self._answer = self._answer, None
        return answer

    def close(self) -> None:
        """Stop asking; a command under way is killed (it would outlive the controller)."""
        self._stopped.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            _kill(proc)
