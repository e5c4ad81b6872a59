"""An elastic job on this machine, for tests and bench/reconfigure.py.

`Job` starts `sailor run` (the controller) and lets the caller start, kill
and inspect node agents one by one: a "node" is an agent process owning
`gpus` worker processes (CPU "GPUs"). Every wait is bounded.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# Samples per step: with the tiny model on CPU "GPUs" the planner uses every node at this batch (2, 4, 6 or 8
# ranks); at smaller batches its estimate may leave a GPU idle, and a node's loss or arrival then changes less.
GLOBAL_BATCH = 64


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


class Job:
    def __init__(self, workdir: Path, train_args: list[str], global_batch: int = GLOBAL_BATCH, min_gpus: int = 6,
                 controller_args: list[str] | None = None, model: str = "tiny"):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.events_path, self.metrics_path = workdir / "events.jsonl", workdir / "metrics.jsonl"
        self.cmd = [PYTHON, "-m", "planner.cli", "run", "--model", model, "--global-batch", str(global_batch),
               "--address-file", str(workdir / "address"), "--events-file", str(self.events_path),
               *(["--gpus", f"CPU@local={min_gpus}"] if min_gpus else []), *(controller_args or []),
               "--", *train_args, "--metrics-file", str(self.metrics_path), "--log-interval", "0"]
        self.agents: dict[str, subprocess.Popen] = {}
        self.start_controller()
        self.store = self.address  # what agents are given (etcd://... for a job whose state is in etcd)

    def start_controller(self, extra: list[str] = ()) -> None:
        """Start `sailor run` (again: a controller that takes over the job from its --state)."""
        address = self.workdir / "address"
        address.unlink(missing_ok=True)
        cmd = self.cmd[:self.cmd.index("--")] + list(extra) + self.cmd[self.cmd.index("--"):]
        self.controller = subprocess.Popen(cmd, cwd=self.workdir, env=env(), stderr=subprocess.STDOUT,
                                           stdout=open(self.workdir / "controller.log", "a"))
        deadline = time.monotonic() + 60
        while not address.exists():
            if self.controller.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"controller did not start:\n{self.log()}")
            time.sleep(0.02)
        self.address = address.read_text().strip()

    # -- nodes ------------------------------------------------------------------------
    def add_agent(self, name: str, gpus: int = 2, detach: bool = False, node_dir: Path | None = None) -> subprocess.Popen:
        """node_dir: the node's own disk (checkpoints saved to node:NAME)."""
        cmd = [PYTHON, "-m", "planner.elastic.agent", "--store", self.store, "--gpus", f"CPU@local={gpus}",
               "--node-id", name, "--heartbeat-s", "0.25", *(["--detach-workers"] if detach else []),
               *(["--node-dir", str(node_dir), "--host", "127.0.0.1"] if node_dir else [])]
        self.agents[name] = subprocess.Popen(cmd, cwd=self.workdir, env=env(),
                                             stdout=open(self.workdir / f"agent-{name}.log", "w"),
                                             stderr=subprocess.STDOUT)
        return self.agents[name]

    def kill_agent(self, name: str, sig: int = signal.SIGKILL) -> float:
        """Signal the agent; returns the wall time just before."""
        t = time.time()
        os.kill(self.agents[name].pid, sig)
        return t

    def worker_pids(self, name: str, gpus: int = 2) -> list[int]:
        from planner.elastic.protocol import ready_key
        from planner.elastic.store import StoreClient

        host, _, port = self.address.rpartition(":")
        client = StoreClient(host, int(port))
        try:
            return [int(client.get(ready_key(name, i), 30.0)) for i in range(gpus)]
        finally:
            client.close()

    # -- what happened ----------------------------------------------------------------
    def metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def events(self, kind: str | None = None) -> list[dict]:
        if not self.events_path.exists():
            return []
        out = [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]
        return [e for e in out if kind is None or e["event"] == kind]

    def log(self) -> str:
        path = self.workdir / "controller.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def agent_log(self, name: str) -> str:
        return (self.workdir / f"agent-{name}.log").read_text()

    def wait_for(self, what, timeout: float, describe: str):
        """Poll `what()` until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            if self.controller.poll() is not None:
                break
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {describe}; controller log:\n{self.log()}")

    def wait_step(self, step: int, timeout: float = 120, epoch: int | None = None) -> list[dict]:
        return self.wait_for(lambda: [m for m in self.metrics() if m["step"] >= step and
                                      (epoch is None or m["epoch"] == epoch)],
                             timeout, f"step {step}" + (f" in epoch {epoch}" if epoch else ""))

    def wait_epoch_started(self, epoch: int, timeout: float = 120) -> dict:
        started = self.wait_for(lambda: [e for e in self.events("epoch_started") if e["epoch"] == epoch], timeout,
                                f"epoch {epoch} to start")
        return started[0]

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.controller.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not finish within {timeout} s; controller log:\n{self.log()}") \
                from None

    def run_with_agent(self, name: str = "a", timeout: float = 120) -> int:
        """One agent joins, the job runs to its end; its exit code (everything is closed after)."""
        try:
            self.add_agent(name)
            return self.wait(timeout)
        finally:
            self.close()

    def close(self, pids: list[int] = ()) -> None:
        """Leave nothing behind (also `pids`: workers of detached agents; and agents `sailor run --local`
        started, which outlive a killed controller so that a new one can take them over)."""
        local = [e["pid"] for e in self.events("node_joined")
                 if e["pid"] not in {a.pid for a in self.agents.values()} and _is_agent(e["pid"])]
        for pid in [*pids, *local]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in [self.controller, *self.agents.values()]:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _is_agent(pid: int) -> bool:
    try:
        return b"planner.elastic.agent" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
