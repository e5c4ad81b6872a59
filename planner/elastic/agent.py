"""A node's agent: joins the job, keeps its heartbeat, owns its workers.

    sailor agent --store HOST:PORT --gpus A100-40@us-central1-a=4 [--node-id NAME] [--node-dir DIR]

It registers the node (GPU type, zone, GPU count) in the controller's store
and starts one worker per GPU right away, so the workers import torch while
the controller decides whether and how to use the node. Then every
--heartbeat-s it bumps its heartbeat counter, restarts a worker that died
or that the controller found frozen (hung/<id>/<i>: the fallback, a fresh
process that loads its state from its peers' memory or the disk), and exits
when the job is done or when the controller fences the node.

When the controller dies the agent reconnects with backoff (to the same
HOST:PORT, or wherever etcd says the new leader serves) while its workers
train on; a new controller re-adopts it. --controller-wait-s bounds that wait.

Its store connection is its lifeline: when the agent dies the controller
sees the connection drop at once. Its workers die with it (the kernel kills
them, PR_SET_PDEATHSIG) unless --detach-workers puts them in their own
session, as torchrun does; the controller then fences the node and the
orphans exit at their next look at the store.

With --node-dir it also serves that directory to the job's other nodes
(files.py): checkpoints saved to node:NAME live on the nodes' own disks, each
file on its node and one other.

Torch-free: the agent never imports torch; its workers do.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

from planner import flags
from planner.elastic import protocol as P
from planner.elastic.store import StoreClient, StoreClosed
from planner.errors import SailorError
from planner.specs.hardware import load_cluster, parse_gpus

EXIT_FENCED, EXIT_LOST_CONTROLLER = 5, 4


def _set_parent_death_signal() -> None:
    """In the child between fork and exec: SIGKILL it when the agent dies."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Agent:
    def __init__(self, store: str, info: P.NodeInfo, heartbeat_s: float = 0.5,
                 detach_workers: bool = False, max_restarts: int = 3, python: str = sys.executable,
                 controller_wait_s: float = 0.0, node_dir: str | None = None, cluster: str | None = None):
        self.store, self.info, self.heartbeat_s = store, info, heartbeat_s
        self.cluster = cluster  # this node's cluster file (GPU types not in the catalog): its workers read it too
        self.node_dir = node_dir  # served to the other nodes: checkpoints saved to node:NAME (files.py)
        self.controller_wait_s = controller_wait_s
        self.detach, self.max_restarts, self.python = detach_workers, max_restarts, python
        self.workers: dict[int, subprocess.Popen] = {}
        self.restarts = 0

    def log(self, line: str) -> None:
        print(f"sailor agent {self.info.id}: {line}", file=sys.stderr, flush=True)

    def spawn(self, index: int) -> subprocess.Popen:
        cmd = [self.python, "-m", "sailor_ext.elastic.worker", "--store", self.store, "--node", self.info.id,
               "--index", str(index), "--controller-wait-s", str(self.controller_wait_s)]
        env = dict(os.environ)
        if self.node_dir:
            env["SAILOR_NODE_DIR"] = self.node_dir
        if self.cluster:
            env["SAILOR_CLUSTER"] = self.cluster
        if self.info.gpu == "CPU":
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, self.info.gpus))))
        if self.detach:
            return subprocess.Popen(cmd, env=env, start_new_session=True)
        return subprocess.Popen([*cmd, "--parent", str(os.getpid())], env=env,
                                preexec_fn=_set_parent_death_signal)

    def stop_workers(self, grace_s: float = 5.0) -> None:
        for p in self.workers.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in self.workers.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def run(self) -> int:
        from planner.elastic.state import locator

        client = StoreClient("", 0, P.agent_identity(self.info.id), locate=locator(self.store), say=self.log,
                             give_up_s=self.controller_wait_s)
        if client.check([P.fence_key(self.info.id)]) or client.check([P.node_key(self.info.id)]):
            raise SailorError(f"node id {self.info.id!r} is already taken in this job; start the agent with "
                              "another --node-id")
        if self.node_dir:
            from dataclasses import replace

            from planner.elastic.files import FileServer

            self.files = FileServer(self.node_dir)  # serves until the agent exits
            self.info = replace(self.info, files=f"http://{self.info.host}:{self.files.port}",
                                files_token=self.files.token)
        client.set(P.node_key(self.info.id), self.info.to_json())
        self.workers = {i: self.spawn(i) for i in range(self.info.gpus)}
        beat = 0
        try:
            while True:
                beat += 1
                client.set(P.heartbeat_key(self.info.id), str(beat))
                if client.check([P.JOB_DONE]):
                    self.wait_workers(grace_s=30.0)
                    return 0
                if client.check([P.fence_key(self.info.id)]):
                    self.log("fenced by the controller; stopping the workers")
                    self.stop_workers()
                    return EXIT_FENCED
                for i, p in list(self.workers.items()):
                    if client.check([P.hung_key(self.info.id, i)]):
                        self.log(f"the controller found worker {i} (pid {p.pid}) frozen; killing it")
                        p.kill()
                        p.wait()
                        client.delete(P.hung_key(self.info.id, i))
                    if p.poll() is not None and not client.check([P.JOB_DONE]):
                        if self.restarts >= self.max_restarts:
                            self.log(f"worker {i} exited with code {p.returncode} after {self.restarts} restarts; "
                                     "giving up on this node")
                            self.stop_workers()
                            return 3
                        self.restarts += 1
                        self.log(f"worker {i} exited with code {p.returncode}; starting a fresh one")
                        self.workers[i] = self.spawn(i)
                time.sleep(self.heartbeat_s)
        except StoreClosed:
            self.log(f"no controller at {self.store} for {self.controller_wait_s:g} s; stopping the workers")
            self.stop_workers()
            return EXIT_LOST_CONTROLLER

    def wait_workers(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        for p in self.workers.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.stop_workers(grace_s=2.0)


def add_parser(subparsers, add_common=None) -> argparse.ArgumentParser:
    p = subparsers.add_parser("agent", help="join a node to an elastic job started with `sailor run`",
                              description="Register this node with the controller of a `sailor run` job and run "
                                          "one worker per GPU.")
    p.add_argument("--store", required=True, metavar="HOST:PORT",
                   help="the job's store, as `sailor run` prints it, or etcd://HOST:PORT/JOB (its --state)")
    p.add_argument("--gpus", required=True, metavar="TYPE@ZONE=N", help="this node's GPUs, e.g. A100-40@us-west1-b=4")
    p.add_argument("--node-id", help="a name unique in the job (default: hostname and a random suffix)")
    p.add_argument("--host", default=None, help="this node's address (default: its hostname)")
    p.add_argument("--cluster", help="cluster file (for GPU types not in the catalog)")
    p.add_argument("--heartbeat-s", type=flags.number(above=0.0, hi=3600.0), default=0.5, metavar="SECONDS",
                   help="seconds between heartbeats (default 0.5)")
    p.add_argument("--detach-workers", action="store_true",
                   help="start workers in their own session: they outlive the agent (the controller fences them)")
    p.add_argument("--controller-wait-s", type=flags.number(0.0, 1e9), default=0.0, metavar="SECONDS",
                   help="give up (stop the workers) after this long without a controller (default 0: wait on; the "
                        "workers train on meanwhile)")
    p.add_argument("--max-restarts", type=flags.integer(0, 10**6), default=3, metavar="N",
                   help="fresh workers to start after crashes (default 3)")
    p.add_argument("--node-dir", metavar="DIR",
                   help="this node's own disk for checkpoints saved to node:NAME (a copy of each file goes to "
                        "another node); served to the job's other nodes over HTTP")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from planner.elastic.state import locator

    locator(args.store)  # a malformed --store is one line, before anything starts
    cluster = load_cluster(args.cluster)
    pools = parse_gpus(args.gpus, cluster)
    if len(pools) != 1:
        raise SailorError(f"--gpus {args.gpus}: a node has GPUs of one type in one zone; start one agent per node")
    pool = pools[0]
    node_id = args.node_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    if "/" in node_id:
        raise SailorError(f"--node-id {node_id!r} may not contain '/'")
    info = P.NodeInfo(node_id, pool.gpu, pool.zone, pool.count, args.host or socket.gethostname(), os.getpid())
    node_dir = None
    if args.node_dir:
        node_dir = os.path.abspath(args.node_dir)
        try:
            os.makedirs(node_dir, exist_ok=True)
        except OSError as e:
            raise SailorError(f"--node-dir {args.node_dir}: cannot create it ({e.strerror})") from None
        if not os.access(node_dir, os.W_OK):
            raise SailorError(f"--node-dir {args.node_dir}: not writable; give a directory on this node's disk")
    try:
        return Agent(args.store, info, args.heartbeat_s, args.detach_workers, args.max_restarts,
                     controller_wait_s=args.controller_wait_s, node_dir=node_dir,
                     cluster=args.cluster and os.path.abspath(args.cluster)).run()
    except StoreClosed as e:
        raise SailorError(f"{e}; is `sailor run` running? (--store {args.store})") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.elastic.agent")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["agent", *(argv if argv is not None else sys.argv[1:])])
    try:
        return run(args)
    except SailorError as e:
        print(f"sailor: error: {e}", file=sys.stderr)
        return e.exit_code
    except StoreClosed as e:
        print(f"sailor: error: {e}; is `sailor run` running?", file=sys.stderr)
        return EXIT_LOST_CONTROLLER


if __name__ == "__main__":
    sys.exit(main())
