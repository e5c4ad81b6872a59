"""One checkpoint, many plans; a damaged newest checkpoint.

A base run (one stage, TP 2 x 2 replicas) trains 4 steps and checkpoints at
steps 2 and 4. Its step-2 checkpoint is resumed under three very different
plans (two pipeline stages; TP 4; two stages x two replicas with TP 2/1 and
1/2 and unequal microbatches): each must reproduce the base run's losses of
steps 3 and 4 (fp32; only the order of sums differs). Then the step-4
checkpoint is damaged and an elastic job (`sailor run --load`) must resume
from step 2 and say so.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from _elastic_helpers import Job

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from _runtime_helpers import assert_ok, plan_dict, run_plan  # noqa: E402

pytestmark = pytest.mark.slow

RTOL = 1e-5
# AdamW's eps 1e-3 keeps it from amplifying rounding differences of near-zero
# gradients (see tests/runtime/test_equivalence.py); clipping is active.
ARGS = ["--seed", "11", "--optimizer", "adam", "--lr", "0.01", "--adam-eps", "1e-3", "--clip-grad", "0.5",
        "--dist-timeout", "60"]
BASE = plan_dict([((0, 5), [2, 2])], [(3, 2), (3, 2)])
PLANS = {
    "two stages": (plan_dict([((0, 2), [1]), ((3, 5), [1])], [(2, 6)]), 2),
    "tp 4": (plan_dict([((0, 5), [4])], [(12, 1)]), 4),
    "stages x replicas, mixed tp": (plan_dict([((0, 2), [2, 1]), ((3, 5), [1, 2])], [(2, 4), (1, 4)]), 6),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("base")
    run = run_plan(workdir, BASE, 4, ["--train-iters", "4", "--save", "ckpt", "--save-interval", "2", *ARGS])
    assert_ok(run)
    assert [m["step"] for m in run.metrics] == [1, 2, 3, 4]
    at2 = workdir / "at2"
    shutil.copytree(workdir / "ckpt" / "iter_0000002", at2)
    return run, at2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_same_checkpoint_resumes_identically_under_another_plan(name, base, tmp_path):
    run, at2 = base
    plan, world = PLANS[name]
    resumed = run_plan(tmp_path, plan, world, ["--train-iters", "4", "--load", str(at2), *ARGS])
    assert_ok(resumed)
    assert [m["step"] for m in resumed.metrics] == [3, 4]
    for mine, theirs in zip(resumed.metrics, run.metrics[2:]):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=RTOL), (name, mine, theirs)
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4), (name, mine, theirs)


@pytest.mark.timeout(300)
def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_and_says_so(base, tmp_path):
    run, _ = base
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run.workdir / "ckpt", ckpt)
    victim = max((ckpt / "iter_0000004").glob("rank*.bin"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    victim.write_bytes(bytes(data))
    job = Job(tmp_path / "job", ["--train-iters", "4", *ARGS], global_batch=12, min_gpus=4,
              controller_args=["--load", str(ckpt)])
    try:
        for name in "ab":
            job.add_agent(name)
        assert job.wait(240) == 0, job.log()
    finally:
        job.close()
    start = next(e for e in job.events("epoch_started") if e["epoch"] == 1)
    assert start["source"] == "disk" and start["step"] == 2
    logs = job.agent_log("a") + job.agent_log("b")
    said = [line for line in logs.splitlines() if "is damaged" in line]
    assert len(said) == 1, logs[-3000:]
    assert f"{ckpt}/iter_0000004 is damaged ({victim.name} fails its SHA-256 checksum" in said[0]
    assert f"resuming from {ckpt}/iter_0000002 (step 2)" in said[0]
    metrics = job.metrics()
    assert [m["step"] for m in metrics] == [3, 4]
    for mine, theirs in zip(metrics, run.metrics[2:]):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=RTOL)
    # the damaged checkpoint was left as it was (nothing deleted), and the job wrote nothing over it
    assert victim.read_bytes() == bytes(data)
