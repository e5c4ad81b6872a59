"""Elastic jobs on this machine: nodes die, join, lose their agent; the job goes on.

Each test starts `sailor run` and agents of 2 CPU "GPUs" each (tiny model,
global batch 12) and checks what the issue asks: the survivors re-plan and
resume from the last checkpoint (in memory), the step counter and the loss
curve continue, nothing before the checkpoint is lost, a joining node is
folded in, an orphaned worker does not keep the job from recovering.
"""
from __future__ import annotations

import signal
import subprocess
import time

import pytest
from _elastic_helpers import GLOBAL_BATCH, PYTHON, Job, alive, env

pytestmark = pytest.mark.slow

LOSS_RTOL = 1e-5  # other plan, same math: only the order of fp32 sums differs
INTERVAL = 4


def train_args(iters: int) -> list[str]:
    return ["--train-iters", str(iters), "--save", "ckpt", "--save-interval", str(INTERVAL), "--dist-timeout", "30",
            "--seed", "3"]


def by_epoch(metrics: list[dict], epoch: int) -> list[dict]:
    return [m for m in metrics if m["epoch"] == epoch]


def published(job: Job, epoch: int) -> dict:
    return next(e for e in job.events("epoch_published") if e["epoch"] == epoch)


def started(job: Job, epoch: int) -> dict:
    return next(e for e in job.events("epoch_started") if e["epoch"] == epoch)


def recovery(job: Job) -> tuple[dict, dict]:
    """(published, started) of the first epoch that ran after epoch 1.

    Usually epoch 2; epoch 3 when a survivor's worker was wedged in gloo and
    restarted (the documented fallback), so that epoch 2 never formed."""
    first_run = min(e["epoch"] for e in job.events("epoch_started") if e["epoch"] > 1)
    return published(job, first_run), started(job, first_run)


def assert_resumed_from_checkpoint(job: Job, last_logged: int, iters: int) -> int:
    """The survivors resumed from the last checkpoint of epoch 1 and trained to the end; returns its step."""
    _, start = recovery(job)
    metrics = job.metrics()
    first, later = by_epoch(metrics, 1), [m for m in metrics if m["epoch"] >= start["epoch"]]
    resume = start["step"]
    assert start["source"] == "memory", start
    # the newest checkpoint every survivor had: the last multiple of the interval (one step later
    # at most, if the survivors finished a step the dead rank 0 never logged)
    assert resume % INTERVAL == 0 and INTERVAL * (last_logged // INTERVAL) <= resume <= last_logged + 1
    assert [m["step"] for m in later] == list(range(resume + 1, iters + 1)), "the step counter must continue"
    replayed = {m["step"]: m["loss"] for m in first if m["step"] > resume}
    assert len(replayed) >= 2, f"the kill came too late to replay two steps: {sorted(replayed)} after {resume}"
    for m in later:
        if m["step"] in replayed:  # the first replayed loss checks the weights, the second the Adam moments too
            assert m["loss"] == pytest.approx(replayed[m["step"]], rel=LOSS_RTOL), (m["step"], m, replayed)
    from sailor_ext.checkpoint import read_logical

    meta, params = read_logical(job.workdir / "ckpt")
    assert meta["step"] == iters and meta["consumed_samples"] == iters * GLOBAL_BATCH, "no step may be lost or repeated"
    assert len(params) > 10
    return resume


@pytest.mark.timeout(240)
def test_node_death_survivors_replan_and_resume(tmp_path):
    """Three nodes; SIGKILL the agent of the node that holds rank 0 (where torchrun's
    c10d store would live) one and two steps after a checkpoint. Its workers die with
    it; the two survivors re-plan for 4 ranks and resume from the checkpoint in memory."""
    iters = 16
    job = Job(tmp_path, train_args(iters))
    try:
        for name in "abc":
            job.add_agent(name)
        job.wait_epoch_started(1)
        head = published(job, 1)["nodes"][0]  # the node of rank 0
        job.wait_step(INTERVAL + 2)
        t_kill = job.kill_agent(head)
        assert job.wait(180) == 0, job.log()
    finally:
        job.close()
    lost = job.events("node_lost")
    assert [e["node"] for e in lost] == [head] and lost[0]["t_detect"] - t_kill < 1.0
    assert job.events("warning") == []  # (it snapshots every INTERVAL steps)
    plan, start = recovery(job)
    assert head not in plan["nodes"] and plan["world"] in (2, 4) and plan["reason"] == "recover"
    last_logged = max(m["step"] for m in by_epoch(job.metrics(), 1))
    assert_resumed_from_checkpoint(job, last_logged, iters)
    # no process was started: the first step on the new plan came well under the re-exec floor
    assert start["t_first_step"] - t_kill < 5.0


@pytest.mark.timeout(240)
def test_agent_killed_its_workers_left_alive(tmp_path):
    """Agents start workers in their own session (as torchrun does), so killing an agent
    leaves its workers running. The controller fences the node: the job recovers on the
    others, and the orphans exit instead of training on unsupervised."""
    iters = 16
    job = Job(tmp_path, train_args(iters))
    orphans: list[int] = []
    try:
        for name in "abc":
            job.add_agent(name, detach=True)
        job.wait_epoch_started(1)
        victim = published(job, 1)["nodes"][1]  # not rank 0's node: the metrics keep flowing
        orphans = job.worker_pids(victim)
        job.wait_step(INTERVAL + 2)
        t_kill = job.kill_agent(victim)
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in orphans) and time.monotonic() < deadline:
            time.sleep(0.01)
        gone = time.time()
        assert job.wait(180) == 0, job.log()
    finally:
        job.close(orphans)
    assert gone - t_kill < 5.0, f"orphans lived {gone - t_kill:.1f} s after their agent:\n{job.agent_log(victim)}"
    plan, start = recovery(job)
    assert start["t_first_step"] - t_kill < 5.0
    assert victim not in plan["nodes"] and plan["world"] in (2, 4)
    last_logged = max(m["step"] for m in by_epoch(job.metrics(), 1))
    assert_resumed_from_checkpoint(job, last_logged, iters)


@pytest.mark.timeout(240)
def test_a_joining_node_is_folded_in(tmp_path):
    """A fourth node joins a running job; the planner's plan with it is faster, so the
    job drains (every rank stops after the same step), re-plans for 8 ranks and goes on
    from that very step: nothing is lost. SIGTERM then ends the job with a checkpoint."""
    job = Job(tmp_path, train_args(10_000), controller_args=["--reconfigure-cost-s", "0"])
    try:
        for name in "abc":
            job.add_agent(name)
        job.wait_epoch_started(1)
        job.add_agent("d")
        start = job.wait_epoch_started(2, timeout=150)
        job.wait_step(start["step"] + 3, epoch=2)
        job.controller.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, job.log()
    finally:
        job.close()
    second = published(job, 2)
    assert second["reason"] == "scale" and "d" in second["nodes"] and second["world"] == 8
    assert [e["node"] for e in job.events("node_lost")] == []
    first, after = by_epoch(job.metrics(), 1), by_epoch(job.metrics(), 2)
    assert start["source"] == "memory" and start["step"] == first[-1]["step"], "a drain loses no step"
    assert after[0]["step"] == first[-1]["step"] + 1
    assert [m["step"] for m in after] == list(range(after[0]["step"], after[-1]["step"] + 1))
    from sailor_ext.checkpoint import read_logical

    meta, _ = read_logical(job.workdir / "ckpt")
    assert meta["step"] == after[-1]["step"], "SIGTERM saves the last step"


@pytest.mark.timeout(240)
def test_provider_drops_a_node_local_agents(tmp_path):
    """`sailor run --local` starts the agents itself; a provider hook (a node-list file)
    stops listing node1, as a cloud does before it reclaims a spot VM: the job drains
    node1 out (nothing lost), fences it, and trains on."""
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("node0\nnode1\nnode2\n")
    job = Job(tmp_path, train_args(10_000), controller_args=[
        "--local", "--gpus-per-node", "2", "--nodes-file", str(nodes), "--nodes-interval-s", "0.2"])
    try:
        job.wait_epoch_started(1, timeout=180)
        job.wait_step(3)
        # replaced whole, as docs/elasticity.md asks: a file rewritten in place can be read empty halfway
        (tmp_path / "nodes.new").write_text("node0\nnode2\n")
        (tmp_path / "nodes.new").replace(nodes)
        start = job.wait_epoch_started(2)
        job.wait_step(start["step"] + 2, epoch=2)
        job.controller.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, job.log()
    finally:
        job.close()
    assert published(job, 1)["world"] == 6
    second = published(job, 2)
    assert "node1" not in second["nodes"] and second["world"] == 4
    assert [e["node"] for e in job.events("node_leaving")] == ["node1"]
    assert [(e["node"], e["cause"]) for e in job.events("node_lost")] == [("node1", "removed by the provider")]
    first = by_epoch(job.metrics(), 1)
    assert start["source"] == "memory" and start["step"] == first[-1]["step"], "a drain loses no step"
    assert by_epoch(job.metrics(), 2)[0]["step"] == first[-1]["step"] + 1


@pytest.mark.timeout(180)
def test_a_checkpoint_of_another_model_ends_the_job_in_one_line(tmp_path):
    """No re-plan can fix a user mistake: the workers report it, the controller
    stops the job with one line naming it, and nothing is written."""
    import torch

    from sailor_ext import checkpoint as C
    from sailor_ext.storage import Storage

    other = tmp_path / "other"
    record = C.write_pieces(Storage(other), 5, 0, [C.Piece("w", None, 0, 0, {"param": torch.ones(3)})])
    C.commit(Storage(other), 5, [record], {"consumed_samples": 60, "optimizer_steps": 5, "optimizer_state": []})
    job = Job(tmp_path / "job", ["--train-iters", "10", "--dist-timeout", "30"], min_gpus=2,
              controller_args=["--load", str(other)])
    code = job.run_with_agent()
    errors = [line for line in job.log().splitlines() if line.startswith("sailor: error:")]
    assert code == 2 and len(errors) == 1, job.log()
    assert "has no tensor layers.0" in errors[0] and "saved for another model" in errors[0]
    assert job.metrics() == [] and sorted(p.name for p in other.iterdir()) == ["iter_0000005", "latest"]
    # (no --save-interval: the job said at start that a lost node would send it back to step 0)
    assert [e["reason"] for e in job.events("warning")] == ["no snapshots"]


@pytest.mark.timeout(180)
def test_a_config_json_model_reaches_the_workers_in_the_plan(tmp_path):
    """`sailor run --model path/config.json --seq-length N`: the workers get neither the path nor the
    length as arguments; every plan carries both (their nodes need not have the file)."""
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128,
        "_name_or_path": "org/tiny-llama"}))
    job = Job(tmp_path / "job", ["--train-iters", "3"], global_batch=4, min_gpus=2, model=str(config),
              controller_args=["--seq-length", "32"])
    code = job.run_with_agent()
    assert code == 0, job.log()
    start = job.events("job_start")[0]
    assert (start["model"], start["seq_length"]) == ("org/tiny-llama", 32) and "--model" not in start["train_args"]
    assert [m["tokens"] for m in job.metrics()] == [4 * 32] * 3


@pytest.mark.timeout(180)
def test_a_gpu_type_of_the_cluster_file_reaches_the_workers(tmp_path):
    """`sailor run --local --cluster FILE` with a GPU type the catalog lacks: the controller planned for it
    and the agents joined, then every worker failed with 'unknown GPU type' (the agent's --cluster now
    reaches its workers)."""
    import json

    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"gpus": {"MYGPU": {
        "memory_gb": 48, "fp32_tflops": 80, "bf16_tflops": 300, "hbm_gbps": 1000, "intra_node_gbps": 100,
        "gpus_per_node": 2, "node_nic_gbps": 10, "price_per_hour": 1.5, "spot_price_per_hour": 0.5}},
        "zones": {"dc-1": {"region": "dc"}}}))
    out = subprocess.run([PYTHON, "-m", "planner.cli", "run", "--model", "tiny", "--global-batch", "4", "--gpus",
                          "MYGPU@dc-1=2", "--local", "--cluster", str(cluster), "--", "--train-iters", "2"],
                         cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=170)
    assert out.returncode == 0 and "training finished" in out.stderr, out.stderr[-3000:]
