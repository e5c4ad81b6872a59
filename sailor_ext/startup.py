"""Startup checks that end every rank at once when any rank fails them.

A rank whose own checks fail before the process group forms (plan against
world size, its placement on the nodes, data files) prints its one-line
error and exits 2. Its peers would otherwise wait in init_process_group for
the missing rank until --dist-timeout, and a launcher that starts several
nodes (torchrun on each, Slurm, Kubernetes) would see no failure on the
other nodes for minutes. So every rank posts its outcome to the rendezvous
store (the one torchrun's agent hosts, or rank 0's) and waits for all
ranks: an error from any rank stops every rank at once with exit 2, and
the process group then forms over the same store.
"""
from __future__ import annotations

import datetime
import os
import time

import torch.distributed as dist

POLL_S = 0.05
REPORT_TIMEOUT_S = 20.0  # how long a failing rank tries to reach the store before it just exits


class PeerFailedAtStartup(Exception):
    """Another rank failed its startup checks (that rank prints why)."""

    def __init__(self, rank: int, error: str):
        super().__init__(f"rank {rank} failed at startup: {error}")
        self.rank, self.error = rank, error


def connect(rank: int, world_size: int, timeout_s: float) -> dist.Store:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT, keyed by torchrun's restart count."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    store = dist.TCPStore(host, port, world_size=None, is_master=hosts_store(rank),  # else torchrun's agent does
                          timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"sailor/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{attempt}", store)


def report(store: dist.Store, rank: int, error: str | None) -> None:
    """Post this rank's outcome: None when its checks passed, else its error line."""
    if error is not None:  # several ranks may fail: the first to post is the one named
        store.set(f"startup/error/{rank}", error)
        store.compare_set("startup/first_failed", "", str(rank))
        store.add("startup/failed", 1)
    store.add("startup/done", 1)


def linger(store: dist.Store, world_size: int, timeout_s: float) -> None:
    """A failing rank that hosts the store keeps it up until every rank has read the outcome or given up."""
    deadline = time.monotonic() + timeout_s
    while store.add("startup/done", 0) < world_size and time.monotonic() < deadline:
        time.sleep(POLL_S)
    time.sleep(10 * POLL_S)  # the last to report still reads the failure


def hosts_store(rank: int) -> bool:
    return rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


def wait_for_all(store: dist.Store, world_size: int, timeout_s: float) -> None:
    """Return when every rank passed its checks; raise PeerFailedAtStartup as soon as one did not."""
    deadline = time.monotonic() + timeout_s
    while True:
        if store.add("startup/failed", 0):
            rank = int(store.get("startup/first_failed").decode())
            raise PeerFailedAtStartup(rank, store.get(f"startup/error/{rank}").decode())
        if store.add("startup/done", 0) >= world_size:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank started within --dist-timeout {timeout_s:g} s")
        time.sleep(POLL_S)
