"""Helpers (imported by the tests) to run sailor_ext.train as a group of processes on this machine.

Ranks are started directly (RANK/WORLD_SIZE/MASTER_* set as torchrun would)
so a test can kill or pause one of them. One thread per process: the suite
runs on 2 cores.

Each rank is a fork of one warm process that has imported torch, megatron-core
and transformers (multiprocessing's fork server, started once per test session):
a fresh interpreter spends ~4 CPU-s importing them, most of a short run's time.
The rank then runs `python -m sailor_ext.train` as its own process would: its
environment, working directory, argv, stdout/stderr in its log, exit code.
SAILOR_TEST_FRESH_RANKS=1 (and any machine with a GPU) starts fresh interpreters
instead; the launchers' own tests (torchrun, Slurm, sailor run) always do.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

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


PRELOAD = ["torch", "megatron.core", "transformers"]
_fork_server: multiprocessing.context.BaseContext | None = None


def _forks() -> multiprocessing.context.BaseContext | None:
    """The fork server's context (started on first use), or None where ranks start fresh."""
    global _fork_server
    if os.environ.get("SAILOR_TEST_FRESH_RANKS") == "1" or os.path.exists("/dev/nvidiactl"):
        return None
    if _fork_server is None:
        from multiprocessing import forkserver

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        with mock.patch.dict(os.environ, {"OMP_NUM_THREADS": "1"}):  # OpenMP reads it as torch loads: in the server
            forkserver.ensure_running()
        _fork_server = ctx
    return _fork_server


def _rank_main(args: list[str], env: dict, cwd: str, log: str) -> None:
    """In the forked rank: become `python -m sailor_ext.train ARGS` run in `cwd` with `env`, output to `log`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    warnings.simplefilter("ignore")  # as PYTHONWARNINGS=ignore does for a fresh rank
    sys.argv = ["sailor_ext.train", *args]
    runpy.run_module("sailor_ext.train", run_name="__main__", alter_sys=True)


class _Forked:
    """The part of subprocess.Popen the tests use, for a forked rank."""

    def __init__(self, proc):
        self._proc, self.pid = proc, proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired("sailor_ext.train", timeout)
        return self._proc.exitcode

    def kill(self) -> None:
        self._proc.kill()


class Ranks:
    """Processes of one run, started together."""

    def __init__(self, workdir: Path, world: int, args: list[str], env: dict | None = None):
        self.workdir, self.world = workdir, world
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        forks = _forks()
        self.procs, self.log_paths = [], []
        for rank in range(world):
            e = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                 "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                 "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", **(env or {})}
            log = workdir / f"rank{rank}.log"
            self.log_paths.append(log)
            if forks is not None:
                proc = forks.Process(target=_rank_main, args=(args, e, str(workdir), str(log)))
                proc.start()
                self.procs.append(_Forked(proc))
            else:
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
