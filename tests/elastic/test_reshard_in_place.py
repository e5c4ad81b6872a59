"""The same four worker processes go through four different plans without restarting.

The test plays the controller (it publishes plans into a store it hosts) for
one agent with four CPU "GPUs", so it can pick plans the planner would not:
TP 2 x 2 replicas -> two stages x two replicas with unequal microbatches ->
TP 4 -> two stages with TP 2 and TP 1 (the fourth worker only hands over
its TP-4 slice, as a donor, then idles). The first two
changes drain (every rank stops after the same step; the state moves between
the workers' memories, nothing is lost), the last aborts mid-step (the ranks
go back to their last snapshot and replay). Every step's loss and the final
weights must match a single process that trained the same batches. The
LLaMA-shaped model also runs the whole sequence in bf16: what moves between
the workers' memories is the fp32 masters and AdamW moments.
"""
from __future__ import annotations

import json
import os
import signal
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


def plans(model: str = "tiny", last: int = 5) -> list[tuple[dict, int]]:
    """(plan, ranks) of the four epochs, for a model whose layers are 0..last."""
    return [
        (plan_dict([((0, last), [2, 2])], [(3, 2), (3, 2)], model=model), 4),
        (plan_dict([((0, 2), [1, 1]), ((3, last), [1, 1])], [(2, 3), (3, 2)], model=model), 4),
        (plan_dict([((0, last), [4])], [(4, 3)], model=model), 4),
        (plan_dict([((0, 2), [2]), ((3, last), [1])], [(1, 12)], model=model), 3),
    ]


PLANS = plans()
# LLaMA-shaped (layers 0..6): its SwiGLU fc1 moves between TP 2, 1 and 4 in the logical [2, ffn, h] layout
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 64}


class ScriptedController:
    """The test in the controller's place: a store, one agent of four workers, plans by hand."""

    def __init__(self, workdir: Path, train_args: list[str], model: str = "tiny"):
        workdir.mkdir()
        self.metrics, self.log = workdir / "metrics.jsonl", workdir / "agent.log"
        self.server = StoreServer()
        host, port = self.server.address
        self.server.set(P.JOB_ARGS, json.dumps(["--model", model, *train_args, "--metrics-file",
                                                str(self.metrics), "--log-interval", "0"]))
        self.agent = subprocess.Popen([PYTHON, "-m", "planner.elastic.agent", "--store", f"{host}:{port}", "--gpus",
                                       "CPU@local=4", "--node-id", "n", "--heartbeat-s", "0.25"], cwd=workdir,
                                      env=env(), stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.wait(lambda: all(self.server.get(P.ready_key("n", i)) for i in range(4)) or None, 120, "the workers")

    def wait(self, what, timeout: float, describe: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value is not None:
                return value
            if self.agent.poll() is not None:
                break
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {describe}:\n{self.log.read_text()[-4000:]}")

    def worker_pid(self, index: int) -> int:
        return int(self.server.get(P.ready_key("n", index)))

    def progress(self, epoch: int) -> int:
        raw = self.server.get(f"progress/{epoch}")
        return int(raw) if raw else 0

    def at_step(self, epoch: int, step: int) -> None:
        self.wait(lambda: self.progress(epoch) >= step or None, 120, f"step {step} in epoch {epoch}")

    def publish(self, epoch: int, plan: dict, world: int, donors: tuple[int, ...] | None = None) -> None:
        """Ranks 0..world-1 on workers 0..world-1; the other workers (or `donors`) donate their memory."""
        donors = tuple(range(world, 4)) if donors is None else donors
        a = P.Assignment(epoch, plan, tuple(("n", r) for r in range(world)), 512, {"CPU": 4},
                         donors=tuple(("n", r) for r in donors))
        self.server.set(P.plan_key(epoch), a.to_json())
        self.server.set(P.EPOCH, str(epoch))

    def stop(self, epoch: int, how: str) -> None:
        self.server.set(P.stop_key(epoch), how)

    def report(self, epoch: int) -> dict | None:
        raw = self.server.get(P.report_key(epoch))
        return json.loads(raw) if raw else None

    def finish(self, epoch: int) -> None:
        self.wait(lambda: self.server.get(P.finished_key(epoch)), 120, "the last step")
        self.server.set(P.JOB_DONE, "1")
        assert self.agent.wait(timeout=60) == 0

    def close(self) -> None:
        if self.agent.poll() is None:
            self.agent.kill()
        self.server.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["opt", "llama", "llama-bf16", "opt-distributed-optimizer"])
def test_workers_reshard_in_memory_across_plans(tmp_path, family):
    """opt-distributed-optimizer: each epoch's ranks keep only their parts of the AdamW moments
    (distributed_optimizer.py); snapshots gather them, so drains and the abort restore as without."""
    model, last = "tiny", 5
    if family.startswith("llama"):
        model, last = str(tmp_path / "config.json"), 6
        (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    bf16 = family.endswith("bf16")
    args = ARGS + ["--bf16"] * bf16
    epochs = plans(model, last)
    reference = run_plan(tmp_path / "reference", plan_dict([((0, last), [1])], [(12, 1)], model=model), 1, args)
    if family.endswith("distributed-optimizer"):
        args = args + ["--use-distributed-optimizer"]
    assert_ok(reference)
    expected = {m["step"]: m["loss"] for m in reference.metrics}

    job = ScriptedController(tmp_path / "job", args, model)
    try:
        job.publish(1, *epochs[0])
        job.at_step(1, 2)
        job.stop(1, P.DRAIN)
        job.publish(2, *epochs[1])
        # drained the moment it is published, while it forms: it must still form, restore,
        # agree on stopping after its first step, and hand over
        job.stop(2, P.DRAIN)
        job.at_step(2, 1)
        job.publish(3, *epochs[2])
        job.at_step(3, 8)
        job.stop(3, P.ABORT)  # mid-step: back to the last snapshot
        job.publish(4, *epochs[3])
        job.finish(4)
    finally:
        job.close()
    log, metrics = job.log, job.metrics
    reports = {e: job.report(e) for e in range(1, 5)}
    assert all(reports.values()), (reports, log.read_text()[-3000:])
    # gloo sometimes leaves an aborted collective unwakeable (StopWatcher in sailor_ext/elastic/worker.py,
    # about 1 abort in 10 here): that worker restarts, its memory is gone, and the plan after the abort
    # loads the checkpoint on disk instead. The drains never abort, so they must always restore from memory.
    wedged = "still stuck in a collective" in log.read_text()
    assert [reports[e]["source"] for e in (2, 3, 4)] == ["memory", "memory", "disk" if wedged else "memory"], reports
    if not wedged:
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
    # bf16 (against the bf16 single process): other plans round other sums in bf16; over these 12 AdamW
    # steps the losses moved apart by up to 2.9e-4 (relative; bf16 and fp32 single processes: 3.7e-4)
    for r in records:  # every loss, replayed or not, is the single process's
        assert r["loss"] == pytest.approx(expected[r["step"]], rel=1e-3 if bf16 else 1e-5), (r, expected[r["step"]])
    from sailor_ext.checkpoint import read_logical

    import torch

    meta, mine = read_logical(tmp_path / "job" / "ckpt")
    _, theirs = read_logical(reference.workdir / "ckpt")
    assert meta["step"] == ITERS and meta["consumed_samples"] == ITERS * 12
    if bf16:
        # the difference over the single process's update from the initial weights (seed 5): measured 1.9e-2
        # for all tensors together, 3.8e-2 for the worst one (bf16 and fp32 single processes: 1.6e-2, 2.9e-2)
        from sailor_ext.model import init_tensor

        updates = {n: t - init_tensor(n, tuple(t.shape), 5, 4) for n, t in theirs.items()}
        for name in theirs:
            assert (mine[name] - theirs[name]).norm() <= 0.1 * updates[name].norm(), name
        error = torch.cat([(mine[n] - theirs[n]).flatten() for n in theirs]).norm()
        assert error <= 5e-2 * torch.cat([u.flatten() for u in updates.values()]).norm()
        return
    # near-zero elements: fp32 rounding of sums taken in other orders, over 12 AdamW steps (measured: the
    # LLaMA run's word embedding, 4 of 32768 elements, 2e-7 apart; the OPT run's within 1e-7)
    atol = 1e-7 if family == "opt" else 5e-7
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.timeout(240)
def test_an_epoch_that_never_forms_is_left_behind(tmp_path):
    """A worker hangs while a plan forms: the others wait in the rendezvous until the
    controller gives up on that epoch; they must then form the next ones with the
    same processes (torch names groups by a counter the abandoned epoch advanced),
    and take the restarted worker back in."""
    job = ScriptedController(tmp_path / "job", ["--train-iters", "1000", "--dist-timeout", "20",
                                                "--save-interval", "3"])
    four, two = PLANS[0], (plan_dict([((0, 5), [2])], [(6, 2)]), 2)
    try:
        job.publish(1, *four)
        job.at_step(1, 4)
        hung = job.worker_pid(3)
        os.kill(hung, signal.SIGSTOP)
        job.stop(1, P.ABORT)
        job.publish(2, *four)  # cannot form: worker 3 is frozen
        time.sleep(1.0)
        job.stop(2, P.ABORT)
        job.publish(3, *two, donors=())  # worker 2 sits this one out: nothing resets its group counter
        job.at_step(3, 2)
        os.kill(hung, signal.SIGKILL)  # its agent starts a fresh worker
        job.wait(lambda: job.worker_pid(3) != hung or None, 120, "the fresh worker")
        job.stop(3, P.DRAIN)
        job.publish(4, *four)  # workers 0-2 all went through the abandoned epoch 2
        job.at_step(4, 2)
        job.stop(4, P.FINISH)
        job.finish(4)
    finally:
        job.close()
    assert job.report(2) is None
    # Where gloo left a survivor's aborted collective unwakeable (see the test above), that worker
    # restarted without its memory; this job saves nothing to disk, so epoch 3 may have to start over.
    wedged = "still stuck in a collective" in job.log.read_text()
    assert job.report(3)["source"] in (("memory", "init") if wedged else ("memory",)), job.report(3)
    assert job.report(4)["source"] == "memory" and job.report(4)["world"] == 4
