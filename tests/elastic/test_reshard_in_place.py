"""The same four worker processes go through four different plans without restarting.

The test plays the controller (it publishes plans into a store it hosts) for
one agent with four CPU "GPUs", so it can pick plans the planner would not:
TP 2 x 2 replicas -> two stages x two replicas with unequal microbatches ->
TP 4 -> two stages with TP 2 and TP 1 (the fourth worker only hands over
its TP-4 slice, as a donor, then idles). The first two
changes drain (every rank stops after the same step; the state moves between
the workers' memories, nothing is lost), the last aborts mid-step (the ranks
go back to their last snapshot and replay). Every step's loss and the final
weights must match a single process that trained the same batches.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _elastic_helpers import PYTHON, env

from planner.elastic import protocol as P
from planner.elastic.store import StoreServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from _runtime_helpers import assert_ok, plan_dict, run_plan  # noqa: E402

pytestmark = pytest.mark.slow

ITERS = 12
ARGS = ["--train-iters", str(ITERS), "--seed", "5", "--optimizer", "adam", "--lr", "0.01", "--adam-eps", "1e-3",
        "--clip-grad", "0.5", "--dist-timeout", "60", "--save", "ckpt", "--save-interval", "3"]
PLANS = [  # (plan, ranks)
    (plan_dict([((0, 5), [2, 2])], [(3, 2), (3, 2)]), 4),
    (plan_dict([((0, 2), [1, 1]), ((3, 5), [1, 1])], [(2, 3), (3, 2)]), 4),
    (plan_dict([((0, 5), [4])], [(4, 3)]), 4),
    (plan_dict([((0, 2), [2]), ((3, 5), [1])], [(1, 12)]), 3),
]


def _wait(what, timeout: float, describe: str, agent: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value is not None:
            return value
        if agent.poll() is not None:
            break
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {describe}:\n{log.read_text()[-4000:]}")


@pytest.mark.timeout(300)
def test_workers_reshard_in_memory_across_plans(tmp_path):
    reference = run_plan(tmp_path / "reference", plan_dict([((0, 5), [1])], [(12, 1)]), 1, ARGS)
    assert_ok(reference)
    expected = {m["step"]: m["loss"] for m in reference.metrics}

    workdir = tmp_path / "job"
    workdir.mkdir()
    metrics = workdir / "metrics.jsonl"
    server = StoreServer()
    host, port = server.address
    server.set(P.JOB_ARGS, json.dumps(["--model", "tiny", *ARGS, "--metrics-file", str(metrics),
                                       "--log-interval", "0"]))
    log = workdir / "agent.log"
    agent = subprocess.Popen([PYTHON, "-m", "planner.elastic.agent", "--store", f"{host}:{port}", "--gpus",
                              "CPU@local=4", "--node-id", "n"], cwd=workdir, env=env(), stdout=open(log, "w"),
                             stderr=subprocess.STDOUT)
    try:
        _wait(lambda: all(server.get(P.ready_key("n", i)) for i in range(4)) or None, 120, "the workers", agent, log)

        def progress(epoch: int) -> int:
            raw = server.get(f"progress/{epoch}")
            return int(raw) if raw else 0

        def publish(epoch: int) -> None:
            plan, world = PLANS[epoch - 1]
            a = P.Assignment(epoch, plan, tuple(("n", r) for r in range(world)), 512, {"CPU": 4},
                             donors=tuple(("n", r) for r in range(world, 4)))
            server.set(P.plan_key(epoch), a.to_json())
            server.set(P.EPOCH, str(epoch))

        def at_step(epoch: int, step: int) -> None:
            _wait(lambda: progress(epoch) >= step or None, 120, f"step {step} in epoch {epoch}", agent, log)

        publish(1)
        at_step(1, 2)
        server.set(P.stop_key(1), P.DRAIN)
        publish(2)
        # drained the moment it is published, while it forms: it must still form, restore,
        # agree on stopping after its first step, and hand over
        server.set(P.stop_key(2), P.DRAIN)
        at_step(2, 1)
        publish(3)
        at_step(3, 8)
        server.set(P.stop_key(3), P.ABORT)  # mid-step: back to the last snapshot
        publish(4)
        _wait(lambda: server.get(P.finished_key(4)), 120, "the last step", agent, log)
        server.set(P.JOB_DONE, "1")
        assert agent.wait(timeout=60) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
        server.close()
    reports = {e: json.loads(server.get(P.report_key(e)) or "null") for e in range(1, 5)}
    assert all(reports.values()), (reports, log.read_text()[-3000:])
    assert [reports[e]["source"] for e in (2, 3, 4)] == ["memory"] * 3, reports
    assert "starting a fresh one" not in log.read_text(), "no worker may have been restarted"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [(r["epoch"], r["step"]) for r in records]
    # drains lose nothing: epochs 2 and 3 start right after the previous epoch's last step
    for e in (2, 3):
        last = max(s for ep, s in steps if ep == e - 1)
        assert reports[e]["step"] == last and min(s for ep, s in steps if ep == e) == last + 1
    assert [s for ep, s in steps if ep == 2] == [reports[2]["step"] + 1], "drained while forming: one step"
    # the abort replays from the last snapshot: a multiple of 3 or where epoch 3 began
    assert reports[4]["step"] % 3 == 0 or reports[4]["step"] == reports[3]["step"]
    assert max(s for _, s in steps) == ITERS
    for r in records:  # every loss, replayed or not, is the single process's
        assert r["loss"] == pytest.approx(expected[r["step"]], rel=1e-5), (r, expected[r["step"]])
    from sailor_ext.checkpoint import read_logical

    import torch

    meta, mine = read_logical(workdir / "ckpt")
    _, theirs = read_logical(reference.workdir / "ckpt")
    assert meta["step"] == ITERS and meta["consumed_samples"] == ITERS * 12
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")
