"""`sailor launch`: training arguments after '--' and the --local rendezvous port, checked before anything is
written or started, each mistake one line (fuzz3 A10, A5)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU = {"format": "sailor-plan", "version": 1, "model": "tiny", "global_batch_size": 2,
       "stages": [{"layers": [0, 5], "replicas": [{"tp": 1, "gpu": "CPU", "zone": "local"}]}],
       "pipelines": [{"microbatch_size": 1, "num_microbatches": 2}]}
A100 = {"model": "opt-125m", "global_batch_size": 8,
        "stages": [{"layers": [0, 13], "replicas": [{"gpu": "A100-40", "tp": 2, "zone": "us-central1-a"}]}],
        "pipelines": [{"microbatch_size": 2, "num_microbatches": 4}]}


def launch(tmp_path, *args, plan=A100):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return subprocess.run([sys.executable, "-m", "planner.cli", "launch", "plan.json", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def refused(out, *words):
    assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr)
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith("sailor: error: "), out.stderr
    assert all(w in out.stderr for w in words), out.stderr


@pytest.mark.parametrize("target", ["torchrun", "slurm", "k8s", "skypilot", "megatron-lm"])
def test_bad_training_arguments_are_one_line_and_nothing_is_written(tmp_path, target):
    out = launch(tmp_path, "--target", target, "-o", "out.txt", "--", "--train-iters", "abc")
    refused(out, "bad training arguments after '--': argument --train-iters", "'abc'")
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("train_args, words", [
    (["--train-iters", "5", "--lr", "-1"], ["argument --lr: must be"]),
    (["--train-iters", "5", "--optimizer", "lion"], ["argument --optimizer"]),
    (["--train-iters", "5", "--fp16", "--bf16"], ["--fp16 and --bf16 exclude each other"]),
    (["--help"], ["--help is not one"]),
    (["--train-iters", "5", "--moe-aux-loss-coeff", "-0.1"], ["argument --moe-aux-loss-coeff: must be"]),
    (["--train-iters", "5", "--moe-aux-loss-coeff", "0.01"],
     ["--moe-aux-loss-coeff weighs a loss on the router of a mixture of experts, and opt-125m has none; drop"]),
    (["--train-iters", "5", "--moe-z-loss-coeff", "0.001"], ["--moe-z-loss-coeff weighs", "opt-125m has none"]),
    (["--train-iters", "5", "--moe-router-bias-update-rate", "0.001"],
     ["--moe-router-bias-update-rate moves the expert score biases of a DeepSeek-V3 router", "opt-125m has none"]),
    (["--train-iters", "5", "--moe-router-bias-update-rate", "2"], ["argument --moe-router-bias-update-rate: must"]),
    (["--train-iters", "5", "--split", "-1,2,0"], ["argument --split: expected one argument (a value that begins "
                                                   "with '-' goes after '=': --split=VALUE)"]),
])
@pytest.mark.parametrize("target", ["slurm", "megatron-lm"])  # (megatron-lm's own parser took --lr -1)
def test_what_every_rank_would_reject_is_refused_at_launch(tmp_path, train_args, words, target):
    refused(launch(tmp_path, "--target", target, "--", *train_args), *words)


@pytest.mark.parametrize("train_args, words", [
    (["--global-batch-size", "7"], ["--global-batch-size 7 disagrees with the plan's global batch 8"]),
    (["--micro-batch-size", "3"], ["--micro-batch-size 3 disagrees with the plan's microbatch sizes [2]"]),
    (["--tensor-model-parallel-size", "2"], ["--tensor-model-parallel-size builds a uniform plan", "drop"]),
    (["--gpu-type", "V100-16"], ["--gpu-type builds a uniform plan"]),
    (["--seq-length", "128"], ["--seq-length 128 contradicts the plan"]),
    (["--model", "opt-350m"], ["--model opt-350m has 26 layers, and the plan's model opt-125m 14; drop --model"]),
])
@pytest.mark.parametrize("target", ["torchrun", "k8s"])
def test_flags_that_contradict_the_plan_are_refused_at_launch(tmp_path, train_args, words, target):
    """Every rank holds its flags against the plan and refuses these (sailor_ext.train.resolve_plan), so launch
    refuses them too, before writing anything (it wrote the files, exit 0)."""
    out = launch(tmp_path, "--target", target, "-o", "out.txt", "--", *train_args,
                 plan={**A100, "seq_length": 256})
    refused(out, "bad training arguments after '--'", *words)
    assert not (tmp_path / "out.txt").exists()


def test_valid_launches_still_print(tmp_path):
    """--plan, the plan's precision flag and the rest that sailor launch adds are accepted; a printed launch file
    may leave --train-iters to the user (a template), a --local run may not."""
    for args in ([], ["--", "--train-iters", "3", "--lr", "0.1"], ["--", "--lr", "0.1"],
                 ["--", "--global-batch-size", "8", "--micro-batch-size", "2"],  # (agreeing with the plan)
                 ["--", "--model", "/on/the/nodes/config.json"]):  # (a path each rank reads on its own node)
        out = launch(tmp_path, *args)
        assert out.returncode == 0 and "-m sailor_ext.train --plan plan.json" in out.stdout, out.stderr
    out = launch(tmp_path, "--target", "megatron-lm", "--", "--train-iters", "3", "--use-distributed-optimizer")
    assert out.returncode == 0 and "--use-distributed-optimizer" in out.stdout, out.stderr
    refused(launch(tmp_path, "--local", "--master-port", "29511", plan=CPU), "--local needs the number of training steps")


def test_a_plan_from_process_substitution_is_refused(tmp_path):
    """`sailor launch <(...)`: the ranks read the plan after launch has returned, when the pipe is gone."""
    (tmp_path / "plan.json").write_text(json.dumps(CPU))
    out = subprocess.run(["bash", "-c", f"{sys.executable} -m planner.cli launch <(cat plan.json) -- --train-iters 1"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    refused(out, "is a pipe or device, which the ranks cannot read once launch has returned; save the plan to a file")


def test_a_cluster_file_after_the_separator_is_one_plain_line(tmp_path):
    refused(launch(tmp_path, "--", "--train-iters", "1", "--cluster", "c.yaml"),
            "sailor: error: give the plan and the cluster file to sailor launch (--cluster FILE before '--')")


def test_local_refuses_a_busy_master_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = launch(tmp_path, "--local", "--master-port", str(port), "--", "--train-iters", "1", plan=CPU)
    refused(out, f"--master-port {port} is not free", "pick a free port with --master-port")
