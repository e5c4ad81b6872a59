"""Start the ranks of a profiling run on this machine and collect rank 0's output (no torch here).

Each rank is `python -m MODULE CONFIG` with the torch.distributed environment set (a free
loopback port, RANK/WORLD_SIZE/LOCAL_RANK); rank 0's stdout is streamed to `on_line`, every
rank's stderr goes to a log. A failed rank ends the run with one line that names it and keeps
the logs for the user.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from planner.errors import SailorError

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local_ranks(module: str, config: Path, world: int, on_line: Callable[[str], None], logdir: Path,
                    timeout_s: float, what: str, rank_env: Callable[[int], dict] = lambda rank: {}) -> None:
    """Run `world` ranks of `module` to the end; raise SailorError naming `what` if one fails."""
    port = free_port()
    procs, logs, handles = [], [], []
    try:
        for rank in range(world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   **rank_env(rank)}
            logs.append(logdir / f"{config.stem}-rank{rank}.log")
            handles.append(open(logs[-1], "w"))
            procs.append(subprocess.Popen([sys.executable, "-m", module, str(config)], env=env, text=True,
                                          stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                          stderr=handles[-1]))
        for line in procs[0].stdout:
            on_line(line)
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:  # never leave our own workers behind
            if p.poll() is None:
                p.kill()
                p.wait()
        for h in handles:
            h.close()
    if any(codes):
        rank = next(i for i, c in enumerate(codes) if c)
        tail = [line for line in logs[rank].read_text().splitlines() if line.strip()]
        kept = Path(tempfile.mkdtemp(prefix="sailor-profile-logs-"))
        for log in logs:
            shutil.copy(log, kept / log.name)
        raise SailorError(f"{what} failed on rank {rank} (exit {codes[rank]}): "
                          f"{tail[-1] if tail else 'no output'}; logs in {kept}")
