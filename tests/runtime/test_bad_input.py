"""Bad input and failing peers: one clear line, non-zero exit, never a hang."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _runtime_helpers import Ranks, plan_dict, run_plan

ROOT = Path(__file__).resolve().parents[2]
TINY_TWO_STAGES = plan_dict([((0, 2), [1]), ((3, 5), [1])], [(2, 2)])


def assert_one_clear_line(log: str, *fragments: str) -> None:
    lines = [line for line in log.splitlines() if line.startswith("sailor: error:")]
    assert len(lines) == 1, log[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in log, log[-2000:]


def test_plan_that_does_not_match_the_world_size(tmp_path):
    run = run_plan(tmp_path, TINY_TWO_STAGES, 3, ["--train-iters", "1"], timeout=60)
    assert run.returncodes == [2, 2, 2]
    assert_one_clear_line(run.log(0), "the plan needs 2 ranks but 3 were started")
    assert run.metrics == []


def test_layer_split_that_does_not_cover_the_model(tmp_path):
    short = plan_dict([((0, 2), [1]), ((3, 4), [1])], [(2, 2)])  # tiny has layers 0..5
    run = run_plan(tmp_path, short, 2, ["--train-iters", "1"], timeout=60)
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "stages cover layers 0..4 but the model has 6 layers",
                          "must end at layer 5")


def test_batch_flag_that_contradicts_the_plan(tmp_path):
    run = run_plan(tmp_path, TINY_TWO_STAGES, 2, ["--train-iters", "1", "--global-batch-size", "8"], timeout=60)
    assert run.returncodes == [2, 2]
    assert_one_clear_line(run.log(0), "--global-batch-size 8 disagrees with the plan's global batch 4")


@pytest.mark.parametrize("flags, named", [
    (["--train-iters", "0"], "--train-iters: must be a positive integer"),
    (["--train-iters", "abc"], "--train-iters: must be a positive integer"), ([], "required: --train-iters"),
    (["--lr", "nan"], "--lr: must be a finite number >= 0"), (["--lr", "-1"], "--lr: must be a finite number >= 0"),
    (["--adam-beta1", "1"], "--adam-beta1: must be a finite number >= 0 and < 1"),
    (["--adam-beta2", "nan"], "--adam-beta2: must be"), (["--adam-eps", "-1"], "--adam-eps: must be"),
    (["--sgd-momentum", "-1"], "--sgd-momentum: must be"), (["--seed", "-1"], "--seed: must be an integer from 0"),
    (["--seed", str(2**64)], "--seed: must be"), (["--make-vocab-size-divisible-by", "0"], "divisible-by: must be"),
    (["--dist-timeout", "inf"], "--dist-timeout: must be"), (["--dist-timeout", "1e30"], "--dist-timeout: must be"),
    (["--eval-iters", str(2**60)], "--eval-iters: must be"), (["--grad-bucket-numel", "0"], "numel: must be"),
    (["--loss-scale", "0"], "--loss-scale: must be a positive"), (["--bogus"], "unrecognized arguments: --bogus"),
    (["--load", ""], "--load: is empty"), (["--save", ""], "--save: is empty"),  # (taken as not given)
    (["--load-hf", ""], "--load-hf: is empty"), (["--model", ""], "--model: is empty"),
    # contradictions Megatron's own checks refuse
    (["--lr", "1e-4", "--min-lr", "1"], "--min-lr 1 is above --lr 0.0001"),
    (["--lr-warmup-iters", "10", "--lr-decay-iters", "2", "--lr-decay-style", "linear"],
     "--lr-warmup-iters 10 must be below --lr-decay-iters 2"),
    (["--mock-data", "--data-path", "corpus"], "--mock-data and --data-path both choose the training data"),
])
def test_a_bad_training_flag_is_one_line(capsys, flags, named):
    """Every number the runtime takes has its range; argparse's own mistakes are one line too."""
    from sailor_ext.train import main

    assert main(([] if flags == [] else ["--train-iters", "1"]) + flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sailor: error: python -m sailor_ext.train: ") and named in err, err


@pytest.mark.parametrize("flag", [["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"],
                                  ["--gpu-type", "A100-40"]])
def test_a_uniform_plan_flag_next_to_a_plan_is_refused(tmp_path, capsys, flag):
    """With --plan these were ignored: TP 2 asked, TP 1 trained."""
    from sailor_ext.train import main

    (tmp_path / "plan.json").write_text(json.dumps(ONE_RANK))
    assert main(["--plan", str(tmp_path / "plan.json"), "--train-iters", "1", *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag[0]} builds a uniform plan" in err and f"drop {flag[0]}" in err, err


@pytest.mark.parametrize("env, named", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' must be an integer from 1"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK='3' must be an integer from 0 to 1"),  # waited forever
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http' must be an integer from 1 to 65535"),
    ({"LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE='abc' must be an integer from 1 to 1"),
    ({"GROUP_WORLD_SIZE": "abc"}, "GROUP_WORLD_SIZE='abc' must be an integer from 1 to 1"),
])
def test_a_bad_launch_environment_is_one_line(capsys, monkeypatch, env, named):
    from sailor_ext.train import main

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["--train-iters", "1", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"sailor: error: environment variable {named}" in err, err


ONE_RANK = plan_dict([((0, 5), [1])], [(2, 1)])


def test_one_process_needs_no_rendezvous_address(tmp_path):
    """`python -m sailor_ext.train` alone (no torchrun) trains: it ended in torch's traceback for MASTER_ADDR."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                            "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-m", "sailor_ext.train", "--model", "tiny", "--train-iters", "2",
                          "--global-batch-size", "2", "--metrics-file", "m.jsonl"], cwd=tmp_path, timeout=120,
                         env={**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.parametrize("target, named", [
    ("plan.json", "--metrics-file plan.json is the --plan file"), ("out", "--metrics-file out is a directory"),
    ("notes.txt", "--metrics-file notes.txt exists and is not a metrics file"),
    ("/dev/full", "cannot write --metrics-file /dev/full (No space left on device)"),
])
def test_a_metrics_file_never_lands_on_an_input(tmp_path, target, named):
    """Rank 0 appends a JSON line per step to --metrics-file: pointed at the plan it corrupted it (exit 0)."""
    if target == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    (tmp_path / "plan.json").write_text(json.dumps(ONE_RANK))
    (tmp_path / "out").mkdir()
    (tmp_path / "notes.txt").write_text("my notes\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    ranks = Ranks(tmp_path, 1, ["--plan", "plan.json", "--train-iters", "2", "--metrics-file", target])
    run = ranks.result(ranks.wait(120))
    assert run.returncodes == [2]
    assert_one_clear_line(run.log(0), named)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before


@pytest.mark.parametrize("save, named", [
    ("plan.json/ckpt", "--save plan.json/ckpt: "), ("ckpt", "checkpoint of step 2 failed on rank 0: "),
], ids=["under-a-file", "fails-at-saving"])
def test_a_save_that_cannot_happen_is_not_a_success(tmp_path, save, named):
    """A --save under a file is refused before training; a save that fails (here: iter_0000002 is a file) ends
    the run with exit 2 and one line, once the steps are done. Both exited 0 with no checkpoint."""
    (tmp_path / "plan.json").write_text(json.dumps(ONE_RANK))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "iter_0000002").write_text("in the way")
    ranks = Ranks(tmp_path, 1, ["--plan", "plan.json", "--train-iters", "2", "--save", save])
    run = ranks.result(ranks.wait(120))
    assert run.returncodes == [2]
    lines = [line for line in run.log(0).splitlines() if line.startswith("sailor: error:")]
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in run.log(0), run.log(0)[-2000:]


def _wait_for_step(workdir, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    metrics = workdir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and sum(1 for _ in metrics.open()) >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"training never reached step {step}")


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["killed", "hung"])
def test_peer_failure_fails_fast_and_keeps_the_last_checkpoint(tmp_path, failure):
    """A rank dies (SIGKILL) or stops answering (SIGSTOP) mid-training; every
    other rank exits with one clear line within --dist-timeout, and the last
    complete checkpoint still loads."""
    plan = plan_dict([((0, 2), [2]), ((3, 5), [1])], [(1, 100)])  # ~1 s steps: the fault lands mid-step
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    ranks = Ranks(tmp_path, 3, ["--plan", "plan.json", "--train-iters", "1000", "--dist-timeout", "5",
                                "--save", "ckpt", "--save-interval", "1", "--metrics-file", "metrics.jsonl"])
    victim = ranks.procs[2]  # the second stage
    try:
        _wait_for_step(tmp_path, 1, timeout=120)
        # checkpoints are written in the background: strike once one is committed, or there is none to keep
        deadline = time.monotonic() + 120
        while not (tmp_path / "ckpt" / "latest").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL if failure == "killed" else signal.SIGSTOP)
        survivors = ranks.procs[:2]
        codes = []
        for p in survivors:
            codes.append(p.wait(timeout=90))
        elapsed = time.monotonic() - started
    finally:
        if victim.poll() is None:
            os.kill(victim.pid, signal.SIGKILL)
        ranks.wait(30)
    run = ranks.result([p.returncode for p in ranks.procs])
    assert codes == [3, 3], (codes, run.logs[0][-2000:])
    assert elapsed < 60, f"survivors took {elapsed:.0f} s to give up"
    for rank in (0, 1):
        assert_one_clear_line(run.log(rank), f"rank {rank} (stage 0, replica 0, TP rank {rank})",
                              "a peer died or did not answer within --dist-timeout 5 s", "--load")
    from sailor_ext.checkpoint import read_logical

    meta, params = read_logical(str(tmp_path / "ckpt"))
    assert meta["step"] >= 1 and meta["consumed_samples"] == meta["step"] * 100
    assert "layers.0.word_embeddings.weight" in params and len(params) > 10


def test_a_fresh_run_never_saves_over_another_runs_checkpoints(tmp_path):
    """Without --load, a run whose --save holds checkpoints replaced them and repointed `latest` (exit 0); it is
    refused, and the same run with --load of that directory resumes from them."""
    (tmp_path / "plan.json").write_text(json.dumps(ONE_RANK))
    first = Ranks(tmp_path, 1, ["--plan", "plan.json", "--train-iters", "2", "--save", "ckpt"])
    assert first.wait(120) == [0]
    kept = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()}
    again = Ranks(tmp_path, 1, ["--plan", "plan.json", "--train-iters", "1", "--seed", "9", "--save", "ckpt"])
    run = again.result(again.wait(120))
    assert run.returncodes == [2]
    assert_one_clear_line(run.log(0), "--save ckpt already holds checkpoints (iter_0000002)", "--load ckpt")
    assert {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "ckpt").rglob("*") if p.is_file()} == kept
    resumed = Ranks(tmp_path, 1, ["--plan", "plan.json", "--train-iters", "3", "--load", "ckpt", "--save", "ckpt"])
    assert resumed.wait(120) == [0]
    past = Ranks(tmp_path, 1, ["--plan", "plan.json", "--train-iters", "1", "--load", "ckpt"])  # (said nothing)
    run = past.result(past.wait(120))
    assert run.returncodes == [0] and "is at step 3, which reaches --train-iters 1: nothing to train" in run.log(0)


def test_an_unreadable_load_url_is_one_line(tmp_path):
    """--load s3://... without credentials: botocore's traceback on every rank before; now one line."""
    pytest.importorskip("s3fs")
    (tmp_path / "plan.json").write_text(json.dumps(ONE_RANK))
    env = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "AWS_PROFILE": ""}
    ranks = Ranks(tmp_path, 1, ["--plan", "plan.json", "--train-iters", "1", "--load", "s3://no-such-bucket/x"], env)
    run = ranks.result(ranks.wait(120))
    assert run.returncodes == [2]
    assert_one_clear_line(run.log(0), "cannot read checkpoints at --load s3://no-such-bucket/x")
