"""`sailor launch`'s torchrun commands, run as two "nodes" on this machine.

The cluster file given after the plan reaches every rank; a rank that fails its startup checks on one node
ends both nodes at once with its own one-line message, instead of leaving the others in the rendezvous.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

from _runtime_helpers import ROOT, free_port

# tiny's 6 layers as one pipeline of 4 stages: stages 0-1 on the CPU node, 2-3 on the "T4" node (a label;
# it trains on CPU). The cluster file gives both types 2 GPUs per node: two nodes of two ranks.
PLAN = {"model": "tiny", "global_batch_size": 8,
        "stages": [{"layers": l, "replicas": [{"gpu": g, "tp": 1, "zone": "local"}]}
                   for l, g in (([0, 1], "CPU"), ([2, 3], "CPU"), ([4, 4], "T4"), ([5, 5], "T4"))],
        "pipelines": [{"microbatch_size": 2, "num_microbatches": 4}]}
CLUSTER = "gpus:\n  CPU: {gpus_per_node: 2}\n  T4: {gpus_per_node: 2}\n"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def node_commands(workdir) -> list[list[str]]:
    (workdir / "plan.json").write_text(json.dumps(PLAN))
    (workdir / "cluster.yaml").write_text(CLUSTER)
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", "plan.json", "--cluster", "cluster.yaml",
                          "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--",
                          "--train-iters", "3", "--metrics-file", "metrics.jsonl"],
                         capture_output=True, text=True, cwd=workdir, env=ENV)
    assert out.returncode == 0, out.stderr
    cmds = [shlex.split(line) for line in out.stdout.splitlines() if line.startswith("torchrun")]
    assert len(cmds) == 2 and all(c[c.index("--cluster") + 1] == "cluster.yaml" for c in cmds)
    return [[sys.executable, "-m", "torch.distributed.run", *c[1:]] for c in cmds]


def start(workdir, cmds) -> list[subprocess.Popen]:
    return [subprocess.Popen(c, cwd=workdir, env=ENV, stdout=open(workdir / f"node{i}.log", "w"),
                             stderr=subprocess.STDOUT) for i, c in enumerate(cmds)]


def finish(procs, timeout: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_nodes_train_with_the_cluster_file(tmp_path):
    codes = finish(start(tmp_path, node_commands(tmp_path)), timeout=240)
    logs = "".join(p.read_text() for p in sorted(tmp_path.glob("node*.log")))
    assert codes == [0, 0], logs[-3000:]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_placement_error_on_one_rank_ends_every_node_at_once(tmp_path):
    """Node 1 reads another cluster file (1 T4 per node): only rank 3 is then misplaced. It says so in one
    line, and both nodes end within seconds, not after the 300 s rendezvous timeout."""
    cmds = node_commands(tmp_path)
    (tmp_path / "other.yaml").write_text(CLUSTER.replace("T4: {gpus_per_node: 2}", "T4: {gpus_per_node: 1}"))
    cmds[1][cmds[1].index("--cluster") + 1] = "other.yaml"
    started = time.monotonic()
    procs = start(tmp_path, cmds)
    said = None
    while said is None and time.monotonic() - started < 120 and any(p.poll() is None for p in procs):
        if "sailor: error:" in "".join(p.read_text() for p in tmp_path.glob("node*.log")):
            said = time.monotonic()
        time.sleep(0.05)
    codes = finish(procs, timeout=60)
    ended = time.monotonic()
    logs = "".join(p.read_text() for p in sorted(tmp_path.glob("node*.log")))
    errors = [line for line in logs.splitlines() if line.startswith("sailor: error:")]
    assert errors == [errors[0]] and errors[0].startswith("sailor: error: rank 3 started as local rank 1 of "
                                                          "node 1, but the plan places it on node 2"), logs[-3000:]
    assert all(c != 0 for c in codes)
    # seconds, not the 300 s rendezvous timeout; 30 leaves room for a CI machine running two test files at once
    # (one took 10.4 s there)
    assert said is not None and ended - said < 30, f"the job took {ended - said:.1f} s to end after the error"
    assert not (tmp_path / "metrics.jsonl").exists()
    print(f"job ended {ended - started:.1f} s after start, {ended - said:.1f} s after rank 3's error")
