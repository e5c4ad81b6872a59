"""Checkpoints are plan-independent: save under one plan, resume under another."""
from __future__ import annotations

import shutil

import pytest
import torch
from _runtime_helpers import assert_ok, plan_dict, run_plan

ARGS = ["--seed", "5", "--optimizer", "adam", "--lr", "0.01", "--adam-eps", "1e-3", "--clip-grad", "0.5",
        "--dist-timeout", "60"]
REFERENCE = plan_dict([((0, 5), [1])], [(12, 1)])
PLAN_A = plan_dict([((0, 5), [4, 2])], [(3, 2), (2, 3)])  # 1 stage, replicas with TP 4 and TP 2
PLAN_B = plan_dict([((0, 2), [2, 1]), ((3, 5), [1, 2])], [(2, 4), (1, 4)])  # 2 stages x 2 replicas


@pytest.mark.slow
def test_resume_under_another_plan_continues_the_same_run(tmp_path):
    """4 steps in one process == 2 steps on plan A, then 2 more on plan B from
    plan A's checkpoint (weights, AdamW moments, step and data position)."""
    from sailor_ext.checkpoint import read_logical

    ref = run_plan(tmp_path / "ref", REFERENCE, 1, ["--train-iters", "4", "--save", "ckpt", *ARGS])
    assert_ok(ref)
    first = run_plan(tmp_path / "a", PLAN_A, 6, ["--train-iters", "2", "--save", "ckpt", *ARGS])
    assert_ok(first)
    second = run_plan(tmp_path / "b", PLAN_B, 6,
                      ["--train-iters", "4", "--load", str(tmp_path / "a" / "ckpt"), "--save", "ckpt", *ARGS])
    assert_ok(second)

    assert [m["step"] for m in second.metrics] == [3, 4]
    losses = first.losses + second.losses
    assert losses == pytest.approx(ref.losses, rel=1e-5)
    meta, mine = read_logical(str(tmp_path / "b" / "ckpt"))
    _, theirs = read_logical(str(tmp_path / "ref" / "ckpt"))
    assert meta["step"] == 4 and meta["consumed_samples"] == 48
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


def test_unfinished_checkpoint_is_never_loaded(tmp_path):
    """A save interrupted before its commit leaves iter_X.tmp; `latest` still
    names the previous complete checkpoint, which is what loads."""
    from sailor_ext.checkpoint import FORMAT, find_latest, open_checkpoint

    save = tmp_path / "ckpt"
    done = save / "iter_0000002"
    done.mkdir(parents=True)
    (done / "meta.json").write_text(f'{{"format": "{FORMAT}", "step": 2, "consumed_samples": 8, '
                                    '"optimizer_steps": 2}')
    torch.save([{"name": "w", "dim": None, "start": 0, "stop": 0, "param": torch.ones(3)}], done / "rank00000.pt")
    (save / "latest").write_text("iter_0000002\n")
    broken = save / "iter_0000003.tmp"
    broken.mkdir()
    (broken / "rank00000.pt.tmp").write_bytes(b"half a file")
    assert find_latest(str(save)) == done
    ckpt = open_checkpoint(str(save))
    assert ckpt.meta["step"] == 2 and torch.equal(ckpt.assemble("w", "param", None, 0, 0, (3,)), torch.ones(3))
    shutil.rmtree(done)
    from planner.errors import SailorError

    with pytest.raises(SailorError):
        open_checkpoint(str(save))
