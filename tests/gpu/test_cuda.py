"""The runtime on a CUDA GPU: NCCL, bf16, fp16, ranks sharing the GPU through gloo, compiled kernels.

Ran on one H100 on 2026-11-25 and 2026-11-27 (bench/results/h100-*): every test
passed, some after the fixes they prompted (docs/runtime.md). It runs only
when selected (`pytest -m cuda tests/gpu`, or tools/gpu_check.sh, which also
runs bench/gpu_step.py) and skips without CUDA; CI never runs it. One GPU is
enough. Every training process runs in strict device mode (conftest.py),
which on CUDA checks that each communicated tensor is a CUDA tensor.

The references are fp32 runs on the CPU (CUDA_VISIBLE_DEVICES hidden), and
the tolerances those of the CPU's bf16 tests (tests/runtime/test_equivalence.py:
bf16 rounding, measured there).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _runtime_helpers import assert_ok, plan_dict, run_plan

import test_equivalence as eq

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
ARGS = eq.common_args(eq.SGD)


@pytest.fixture(scope="module")
def cpu_reference(tmp_path_factory):
    run = run_plan(tmp_path_factory.mktemp("cpu-fp32"), eq.REFERENCE, 1, ARGS, env=CPU_ONLY)
    assert_ok(run)
    assert "fp32 on cpu" in run.log(0)
    return run


def test_one_rank_nccl_bf16_matches_the_cpu_fp32_run(tmp_path, cpu_reference):
    """bf16 is the default on CUDA; the world of one is an NCCL group."""
    run = run_plan(tmp_path, eq.REFERENCE, 1, ARGS)
    assert_ok(run)
    assert "bf16 on cuda (nccl)" in run.log(0), run.log(0)[-2000:]
    eq.assert_within_bf16(run, cpu_reference)


def test_fp32_on_cuda_matches_the_cpu(tmp_path, cpu_reference):
    """The same fp32 training on another device: only the order of sums differs (TF32 stays off)."""
    run = run_plan(tmp_path, eq.REFERENCE, 1, [*ARGS, "--no-bf16"])
    assert_ok(run)
    assert "fp32 on cuda (nccl)" in run.log(0)
    for mine, theirs in zip(run.metrics, cpu_reference.metrics, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4)
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-3)


def test_ranks_sharing_the_gpu_through_gloo(tmp_path, cpu_reference):
    """Three ranks on one GPU (NCCL refuses two ranks per GPU; gloo all-reduces CUDA tensors): one stage,
    replicas with TP 2 and TP 1 and unequal microbatches, bf16, within bf16's error of the CPU's fp32 single
    process."""
    plan = plan_dict([((0, 5), [2, 1])], [(3, 2), (2, 3)])
    run = run_plan(tmp_path, plan, 3, [*ARGS, "--distributed-backend", "gloo"])
    assert_ok(run)
    assert "bf16 on cuda (gloo)" in run.log(0)
    eq.assert_within_bf16(run, cpu_reference)


def test_gloo_on_cuda_refuses_the_distributed_optimizer_in_one_line(tmp_path):
    """Its reduce-scatters and all-gathers of CUDA tensors need NCCL (seen on an H100: the refusal, before
    any process group work)."""
    plan = plan_dict([((0, 5), [2, 1])], [(3, 2), (2, 3)])
    run = run_plan(tmp_path, plan, 3, [*ARGS, "--distributed-backend", "gloo", "--use-distributed-optimizer"])
    assert run.returncodes == [2, 2, 2]
    assert run.log(0).strip().splitlines()[-1] == (
        "sailor: error: --use-distributed-optimizer needs nccl on CUDA (gloo cannot all-gather CUDA tensors); "
        "drop the flag or --distributed-backend gloo"), run.log(0)[-2000:]


def _with_cpu_reference(tmp_path_factory, name: str, fields: dict):
    """(plan, the plan's fp32 run on the CPU) of a one-rank plan of the config.json `fields`."""
    config = tmp_path_factory.mktemp(name) / "config.json"
    config.write_text(json.dumps(fields))
    plan = plan_dict([((0, 6), [1])], [(12, 1)], model=str(config))
    reference = run_plan(tmp_path_factory.mktemp(f"{name}-cpu-fp32"), plan, 1, ARGS, env=CPU_ONLY)
    assert_ok(reference)
    return plan, reference


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The CPU tests' LLaMA shape (RMSNorm, SwiGLU, rotary, grouped queries) and its fp32 run on the CPU."""
    return _with_cpu_reference(tmp_path_factory, "llama", eq.LLAMA)


@pytest.mark.parametrize("fused", [True, False], ids=["compiled", "eager"])
def test_llama_with_and_without_kernel_fusion_matches_the_cpu_fp32_run(tmp_path, llama, fused):
    """SwiGLU and rotary positions as compiled kernels (the CUDA default) or as megatron's separate ones
    (--no-bias-swiglu-fusion --no-rope-fusion): both within bf16's error of the CPU's fp32 run."""
    plan, reference = llama
    run = run_plan(tmp_path, plan, 1, [*ARGS, *([] if fused else ["--no-bias-swiglu-fusion", "--no-rope-fusion"])])
    assert_ok(run)
    assert ("compiled swiglu and rope kernels" in run.log(0)) == fused, run.log(0)[-2000:]
    eq.assert_within_bf16(run, reference)


@pytest.fixture(scope="module")
def qwen3_5(tmp_path_factory):
    """The CPU tests' Qwen3.5 shape (Gated DeltaNet blocks between blocks of gated attention) and its fp32 run on
    the CPU."""
    return _with_cpu_reference(tmp_path_factory, "qwen3_5", eq.QWEN3_5)


def test_gated_delta_net_matches_the_cpu_fp32_run(tmp_path, qwen3_5):
    """Gated DeltaNet in bf16 on CUDA (the convolution in bf16; the chunked rule's triangular solves and state in
    fp32) and megatron's gated attention: within bf16's error of the CPU's fp32 run. Written without a GPU (none
    was lent): not yet run on one."""
    plan, reference = qwen3_5
    run = run_plan(tmp_path, plan, 1, ARGS)
    assert_ok(run)
    assert "bf16 on cuda (nccl)" in run.log(0), run.log(0)[-2000:]
    eq.assert_within_bf16(run, reference)


def test_gloo_on_cuda_refuses_pipeline_stages_in_one_line(tmp_path):
    """gloo cannot send CUDA tensors (its TCP transport reads them as host memory: 'Bad address')."""
    run = run_plan(tmp_path, eq.PLANS["pp_only"], 3, [*ARGS, "--distributed-backend", "gloo"])
    assert run.returncodes == [2, 2, 2]
    assert run.log(0).strip().splitlines()[-1] == (
        "sailor: error: gloo cannot send CUDA tensors between pipeline stages, and this plan has 3; use nccl "
        "(one rank per GPU) or a one-stage plan"), run.log(0)[-2000:]
    assert "Traceback" not in "".join(run.logs)


def test_bf16_checkpoint_resumes_on_cuda(tmp_path):
    """The snapshot's host copy of the fp32 masters goes to disk and back to the GPU: 2 + 2 steps give the
    4 straight steps' losses (CUDA kernels such as attention's backward may sum in any order: rel 1e-4)."""
    args = ["--seed", "5", "--optimizer", "adam", "--lr", "0.01", "--dist-timeout", "60"]
    straight = run_plan(tmp_path / "straight", eq.REFERENCE, 1, ["--train-iters", "4", *args])
    first = run_plan(tmp_path / "first", eq.REFERENCE, 1, ["--train-iters", "2", "--save", "ckpt", *args])
    assert_ok(straight)
    assert_ok(first)
    resumed = run_plan(tmp_path / "resumed", eq.REFERENCE, 1,
                       ["--train-iters", "4", "--load", str(tmp_path / "first" / "ckpt"), *args])
    assert_ok(resumed)
    assert first.losses + resumed.losses == pytest.approx(straight.losses, rel=1e-4)


def test_fp16_overflow_on_cuda_skips_the_step(tmp_path):
    run = run_plan(tmp_path, eq.REFERENCE, 1, ["--train-iters", "4", "--fp16", "--initial-loss-scale", "1024",
                                               "--hysteresis", "1", "--dist-timeout", "60"],
                   env={"SAILOR_TEST_GRAD_OVERFLOW": "2:0"})
    assert_ok(run)
    assert [m["skipped"] for m in run.metrics] == [False, True, False, False]
    assert [m["loss_scale"] for m in run.metrics] == [1024.0, 1024.0, 512.0, 512.0]


def test_no_host_synchronisation_inside_a_step(tmp_path):
    """torch's sync debug mode raises on any synchronising call inside steps 2-4 (bf16, AdamW, clipping; one
    rank, so no gradient buckets: those need replicas on two GPUs); the metrics lines read the numbers between
    steps."""
    run = run_plan(tmp_path, eq.REFERENCE, 1, ["--train-iters", "4", "--optimizer", "adam", "--clip-grad", "1.0",
                                               "--dist-timeout", "60"], env={"SAILOR_CUDA_SYNC_DEBUG": "1"})
    assert_ok(run)
    assert len(run.metrics) == 4 and all(m["peak_memory_bytes"] > 0 for m in run.metrics)


def test_fp16_profile_on_cuda(tmp_path):
    """`sailor profile model --precision fp16` (for plans on GPUs without bf16) measures the runtime's fp16 layers
    and optimizer step; the store hands the profile to fp16 plans as measured and converts it for bf16 ones."""
    import subprocess
    import sys

    from planner.profiles.store import load_profiles
    from planner.specs.model import get_model

    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "planner.cli", "profile", "model", "--model", "tiny", "--device",
                          "cuda", "--gpu", "H100-80", "--precision", "fp16", "--micro-batch-sizes", "1,2",
                          "--warmup", "1", "--repeats", "3", "-o", tmp_path],
                         capture_output=True, text=True, cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    written = json.loads((tmp_path / "tiny" / "H100-80" / "profile.json").read_text())  # (a label: any GPU)
    assert written["precision"] == "fp16" and written["optimizer_s_per_param"] > 0
    model = get_model("tiny")
    store = load_profiles([str(tmp_path)], model="tiny", runtime="sailor")
    gpu = store._gpus["H100-80"]
    measured = store.get(model, gpu, "fp16")
    assert measured.precision == "fp16" and "converted_from" not in measured.meta
    assert all(t > 0 for lt in measured.times.values() for t in lt.fwd + lt.bwd)
    assert store.get(model, gpu, "bf16").meta["converted_from"] == "fp16"
