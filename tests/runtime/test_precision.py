"""Mixed precision (sailor_ext/precision.py): fp16 loss scaling and its skipped steps, bf16 resumes.

bf16 against fp32 under every equivalence plan, and the cut that does not
change bf16 numbers, are in test_equivalence.py.
"""
from __future__ import annotations

import argparse
import math
import shutil

import pytest
import torch
from _runtime_helpers import assert_ok, plan_dict, run_plan

from planner.errors import SailorError
from sailor_ext.precision import LossScaler, PrecisionConfig, precision_config

TWO_STAGES = plan_dict([((0, 2), [1]), ((3, 5), [1])], [(2, 3)])


def _args(**kw) -> argparse.Namespace:
    base = dict(bf16=None, fp16=False, loss_scale=None, initial_loss_scale=None, min_loss_scale=None,
                loss_scale_window=None, hysteresis=None)
    return argparse.Namespace(**{**base, **kw})


def test_precision_defaults_and_mistakes():
    assert precision_config(_args(), cuda=False).name == "fp32"
    assert precision_config(_args(), cuda=True).name == "bf16"  # Megatron's choice on GPUs
    assert precision_config(_args(bf16=False), cuda=True).name == "fp32"
    assert precision_config(_args(bf16=True), cuda=False).name == "bf16"
    fp16 = precision_config(_args(fp16=True, initial_loss_scale=1024.0, hysteresis=1), cuda=True)
    assert (fp16.name, fp16.initial_loss_scale, fp16.hysteresis, fp16.loss_scale_window) == ("fp16", 1024.0, 1, 1000)
    for bad, says in ((dict(fp16=True, bf16=True), "--fp16 and --bf16 exclude each other"),
                      (dict(bf16=True, loss_scale=128.0), "--loss-scale sets fp16 loss scaling"),
                      (dict(fp16=True, initial_loss_scale=1.0, min_loss_scale=4.0), "exceeds --initial-loss-scale"),
                      (dict(fp16=True, hysteresis=0), "at least 1"),
                      (dict(fp16=True, loss_scale=0.0), "--loss-scale must be positive")):
        with pytest.raises(SailorError, match=says):
            precision_config(_args(**bad), cuda=False)


def test_loss_scaler_follows_megatron():
    """Megatron's DynamicGradScaler: overflows halve the scale once `hysteresis` of them came without a
    clean window between; `window` clean steps double it and restore the hysteresis budget."""
    s = LossScaler(PrecisionConfig("fp16", initial_loss_scale=2.0**16, min_loss_scale=2.0**14,
                                   loss_scale_window=3, hysteresis=2))
    seen = []
    for found_inf in (True, True, True, False, False, False, True, True, True, True):
        s.update(found_inf)
        seen.append(s.scale)
    assert seen == [2**16, 2**15, 2**14, 2**14, 2**14, 2**15, 2**15, 2**14, 2**14, 2**14]  # floor 2^14
    restored = LossScaler(PrecisionConfig("fp16", loss_scale_window=3, hysteresis=2))
    restored.load_state_dict(s.state_dict())
    assert restored.state_dict() == s.state_dict()
    constant = LossScaler(PrecisionConfig("fp16", loss_scale=128.0))
    constant.update(True)
    constant.load_state_dict({"scale": 1.0, "clean_steps": 0, "overflows_left": 1})
    assert constant.scale == 128.0


@pytest.mark.slow
def test_fp16_overflow_skips_the_step_and_halves_the_scale(tmp_path):
    """An inf in one gradient of the first stage at step 3 (the test hook): every rank skips that step
    (the weights of both stages and the optimizer's step count stay, the LR schedule does not move on),
    the scale halves (hysteresis 1), the data moves on and training continues, as in Megatron."""
    run = run_plan(tmp_path, TWO_STAGES, 2,
                   ["--train-iters", "5", "--seed", "3", "--fp16", "--initial-loss-scale", "1024", "--hysteresis", "1",
                    "--lr-warmup-iters", "10", "--save", "ckpt", "--save-interval", "1", "--keep-checkpoints", "0",
                    "--dist-timeout", "60"],
                   env={"SAILOR_TEST_GRAD_OVERFLOW": "3:0"})
    assert_ok(run)
    assert "fp16 on cpu" in run.log(0) and "step 3/5 | loss" in run.log(0) and "skipped: a gradient overflowed" \
        in run.log(0)
    m = run.metrics
    assert [r["skipped"] for r in m] == [False, False, True, False, False]
    assert [r["loss_scale"] for r in m] == [1024.0, 1024.0, 1024.0, 512.0, 512.0]
    assert m[2]["grad_norm"] is None and all(math.isfinite(r["loss"]) for r in m)
    assert m[2]["lr"] == m[3]["lr"] > m[1]["lr"], "a skipped step does not advance the LR schedule"

    from sailor_ext.checkpoint import read_logical

    def state(step: int):
        return read_logical(str(tmp_path / "ckpt" / f"iter_{step:07d}"))  # (meta, logical tensors)

    (_, before), (meta3, skipped), (_, after) = state(2), state(3), state(4)
    assert all(torch.equal(before[n], skipped[n]) for n in before), "the skipped step changed the weights"
    assert not all(torch.equal(skipped[n], after[n]) for n in skipped), "training stopped"
    assert (meta3["step"], meta3["optimizer_steps"], meta3["consumed_samples"]) == (3, 2, 18)
    assert meta3["loss_scaler"]["scale"] == 512.0 and meta3["precision"] == "fp16"
    assert state(5)[0]["optimizer_steps"] == 4


@pytest.mark.slow
def test_bf16_run_resumes_exactly_from_its_fp32_masters(tmp_path):
    """4 bf16 steps straight = 2 steps, a checkpoint, then 2 more from it: bitwise. The checkpoint holds
    the fp32 masters (values a bf16 weight cannot hold), not the bf16 weights."""
    args = ["--seed", "5", "--bf16", "--optimizer", "adam", "--lr", "0.01", "--dist-timeout", "60"]
    straight = run_plan(tmp_path / "straight", TWO_STAGES, 2, ["--train-iters", "4", "--save", "ckpt", *args])
    first = run_plan(tmp_path / "first", TWO_STAGES, 2, ["--train-iters", "2", "--save", "ckpt", *args])
    assert_ok(straight)
    assert_ok(first)
    resumed = run_plan(tmp_path / "resumed", TWO_STAGES, 2,
                       ["--train-iters", "4", "--load", str(tmp_path / "first" / "ckpt"), "--save", "ckpt", *args])
    assert_ok(resumed)
    assert first.losses + resumed.losses == straight.losses
    from sailor_ext.checkpoint import read_logical

    meta, masters = read_logical(str(tmp_path / "first" / "ckpt"))
    assert meta["precision"] == "bf16" and meta["weights"] == "fp32 main parameters"
    w = masters["layers.1.mlp.linear_fc1.weight"]
    assert w.dtype == torch.float32 and not torch.equal(w, w.bfloat16().float())
    _, end = read_logical(str(tmp_path / "resumed" / "ckpt"))
    _, expected = read_logical(str(tmp_path / "straight" / "ckpt"))
    assert all(torch.equal(end[n], expected[n]) for n in expected)
    # any plan resumes it: one process takes the two stages' masters and goes on
    one = run_plan(tmp_path / "one", plan_dict([((0, 5), [1])], [(6, 1)]), 1,
                   ["--train-iters", "3", "--load", str(tmp_path / "first" / "ckpt"), *args])
    assert_ok(one)
    assert one.losses == pytest.approx(straight.losses[2:3], rel=1e-4)


def test_fp16_and_bf16_together_is_one_line(tmp_path):
    run = run_plan(tmp_path, TWO_STAGES, 2, ["--train-iters", "1", "--fp16", "--bf16"], timeout=60)
    assert run.returncodes == [2, 2]
    lines = [line for line in run.log(0).splitlines() if line.startswith("sailor: error:")]
    assert lines == ["sailor: error: --fp16 and --bf16 exclude each other; choose one (bf16 needs no loss scaling)"]
    assert "Traceback" not in run.log(0) + run.log(1) and not run.log(1).strip()
    shutil.rmtree(tmp_path)
    run = run_plan(tmp_path, TWO_STAGES, 2, ["--train-iters", "1", "--distributed-backend", "nccl"], timeout=60)
    assert run.returncodes == [2, 2] and "--distributed-backend nccl needs CUDA GPUs" in run.log(0), run.log(0)
