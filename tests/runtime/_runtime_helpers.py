"""Helpers (imported by the tests) to run sailor_ext.train as a group of processes on this machine.

Ranks are started directly (RANK/WORLD_SIZE/MASTER_* set as torchrun would)
so a test can kill or pause one of them. One thread per process: the suite
runs on 2 cores.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU = {"gpu": "CPU", "zone": "local"}


def plan_dict(stages, pipelines, model="tiny", gbs=None, recompute=()) -> dict:
    """stages: [((first, last), [tp, ...])]; pipelines: [(mbs, n)]; recompute: indices of stages that do."""
    return {
        "format": "sailor-plan", "version": 1, "model": model,
        "global_batch_size": gbs if gbs is not None else sum(m * n for m, n in pipelines),
        "stages": [{"layers": list(layers), "replicas": [{"tp": tp, **CPU} for tp in tps],
                    **({"recompute": True} if s in recompute else {})}
                   for s, (layers, tps) in enumerate(stages)],
        "pipelines": [{"microbatch_size": m, "num_microbatches": n} for m, n in pipelines],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Run:
    returncodes: list[int]
    logs: list[str]
    metrics: list[dict]
    workdir: Path

    def log(self, rank: int = 0) -> str:
        return self.logs[rank]

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics]


class Ranks:
    """Processes of one run, started together."""

    def __init__(self, workdir: Path, world: int, args: list[str], env: dict | None = None):
        self.workdir, self.world = workdir, world
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.procs, self.log_paths = [], []
        for rank in range(world):
            e = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                 "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                 "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", **(env or {})}
            log = workdir / f"rank{rank}.log"
            self.log_paths.append(log)
            self.procs.append(subprocess.Popen([sys.executable, "-m", "sailor_ext.train", *args], cwd=workdir,
                                               env=e, stdout=open(log, "w"), stderr=subprocess.STDOUT))

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p in self.procs:  # never leave a straggler behind
            if p.poll() is None:
                p.kill()
                p.wait()
        return codes

    def result(self, codes: list[int]) -> Run:
        metrics_path = self.workdir / "metrics.jsonl"
        metrics = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() \
            else []
        return Run(codes, [p.read_text() for p in self.log_paths], metrics, self.workdir)


def run_plan(workdir: Path, plan: dict | None, world: int, args: list[str], timeout: float = 240,
             env: dict | None = None) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    full = list(args)
    if plan is not None:
        (workdir / "plan.json").write_text(json.dumps(plan))
        full = ["--plan", "plan.json", *full]
    ranks = Ranks(workdir, world, [*full, "--metrics-file", "metrics.jsonl"], env)
    return ranks.result(ranks.wait(timeout))


def assert_ok(run: Run) -> None:
    if any(code != 0 for code in run.returncodes):
        bad = next(i for i, c in enumerate(run.returncodes) if c != 0)
        raise AssertionError(f"rank {bad} exited {run.returncodes[bad]}:\n{run.logs[bad][-3000:]}")
