"""Checkpoints are plan-independent: save under one plan, resume under another."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _runtime_helpers import assert_ok, plan_dict, run_plan

ARGS = ["--seed", "5", "--optimizer", "adam", "--lr", "0.01", "--adam-eps", "1e-3", "--clip-grad", "0.5",
        "--dist-timeout", "60"]
REFERENCE = plan_dict([((0, 5), [1])], [(12, 1)])
PLAN_A = plan_dict([((0, 5), [4, 2])], [(3, 2), (2, 3)])  # 1 stage, replicas with TP 4 and TP 2
PLAN_B = plan_dict([((0, 2), [2, 1]), ((3, 5), [1, 2])], [(2, 4), (1, 4)])  # 2 stages x 2 replicas


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """The reference: 4 steps in one process."""
    root = tmp_path_factory.mktemp("ref")
    ref = run_plan(root, REFERENCE, 1, ["--train-iters", "4", "--save", "ckpt", *ARGS])
    assert_ok(ref)
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--use-distributed-optimizer"]], ids=["whole", "distributed-optimizer"])
def test_resume_under_another_plan_continues_the_same_run(tmp_path, four_steps, flags):
    """4 steps in one process == 2 steps on plan A, then 2 more on plan B from
    plan A's checkpoint (weights, AdamW moments, step and data position). With the distributed
    optimizer each rank saves the moments gathered from its bucket's owners and keeps its own part
    of them on loading, under plans whose replicas shard the weights differently (TP 4 and 2)."""
    from sailor_ext.checkpoint import read_logical

    ref = four_steps
    first = run_plan(tmp_path / "a", PLAN_A, 6, ["--train-iters", "2", "--save", "ckpt", *ARGS, *flags])
    assert_ok(first)
    second = run_plan(tmp_path / "b", PLAN_B, 6,
                      ["--train-iters", "4", "--load", str(tmp_path / "a" / "ckpt"), "--save", "ckpt", *ARGS, *flags])
    assert_ok(second)

    assert [m["step"] for m in second.metrics] == [3, 4]
    losses = first.losses + second.losses
    assert losses == pytest.approx(ref.losses, rel=1e-5)
    meta, mine = read_logical(str(tmp_path / "b" / "ckpt"))
    _, theirs = read_logical(str(ref.workdir / "ckpt"))
    assert meta["step"] == 4 and meta["consumed_samples"] == 48
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


def _save(root: str, step: int) -> None:
    """A checkpoint of two "ranks": one holds rows 0..3 of w (with its Adam moments) and b, the other rows 4..5."""
    from sailor_ext import checkpoint as C
    from sailor_ext.storage import Storage

    storage, v = Storage(root), float(step)
    mine = [C.Piece("w", 0, 0, 4, {"param": torch.full((4, 3), v), "exp_avg": torch.full((4, 3), -v)}),
            C.Piece("b", None, 0, 0, {"param": torch.arange(3.0) + v, "exp_avg": torch.zeros(3)})]
    theirs = [C.Piece("w", 0, 4, 6, {"param": torch.full((2, 3), v), "exp_avg": torch.full((2, 3), -v)})]
    files = [C.write_pieces(storage, step, 0, mine), C.write_pieces(storage, step, 1, theirs)]
    C.commit(storage, step, files, {"consumed_samples": 12 * step, "optimizer_steps": step,
                                    "optimizer_state": ["exp_avg"]}, keep=3)


def _newest_files(root: str) -> list[str]:
    from sailor_ext.storage import Storage

    storage = Storage(root)
    return ["latest"] + [f"iter_0000004/{n}" for n in storage.children("iter_0000004")]


def _flip_and_resume(root: str, rel: str, at: int, mask: int):
    """Flip byte `at` of `rel` with `mask`, resume as every rank together would, put the byte back."""
    from sailor_ext import checkpoint as C
    from sailor_ext.storage import Storage

    storage = Storage(root)
    good = storage.get(rel)
    bad = bytearray(good)
    bad[at] ^= mask
    storage.put(rel, bad)
    try:
        return C.load_logical(root)
    finally:
        storage.put(rel, good)


def _positions(rel: str, data: bytes) -> list[int]:
    """Where to flip: the first and last byte, 60 more spread at random (fixed seed), and in meta.json
    every byte of the step, consumed samples and optimizer steps (a change there would resume at the
    wrong step, data position or optimizer state)."""
    import random
    import re

    at = {0, len(data) - 1, *random.Random(rel).sample(range(len(data)), min(len(data), 60))}
    if rel.endswith("meta.json"):
        for m in re.finditer(rb'"(step|consumed_samples|optimizer_steps)": (\d+)', data):
            at.update(range(m.start(2), m.end(2)))
    return sorted(at)


def test_any_flipped_byte_of_the_newest_checkpoint_is_caught(tmp_path, monkeypatch):
    """Bytes of every file of the newest checkpoint, and of `latest`, flipped in turn (one bit, or all
    bits): the data or meta.json damaged -> the previous checkpoint loads and one line says why;
    `latest` damaged -> the newest checkpoint (intact) still loads, and one line says so. Hash blocks
    of 24 bytes (two rows of w), so that tensors span several."""
    from sailor_ext import checkpoint as C

    monkeypatch.setattr(C, "BLOCK_BYTES", 24)

    root = str(tmp_path / "ckpt")
    _save(root, 2)
    _save(root, 4)
    choice, meta, ref = C.load_logical(root)
    assert (choice.step, meta["consumed_samples"], choice.notes()) == (4, 48, [])
    assert len(meta["files"][min(meta["files"])]["pieces"][0]["tensors"]["param"]["sha256"]) == 2  # w: 4 rows
    ckpt = C.open_choice(choice)  # a rank that needs rows 2..3 of w reads and checks their block alone
    assert torch.equal(ckpt.assemble("w", "param", 0, 2, 4, (2, 3)), torch.full((2, 3), 4.0))
    assert [k[1:] for k in ckpt._read] == [(1, 2)]
    files = _newest_files(root)
    assert len(files) == 4  # latest, meta.json and the two rank files
    checked = 0
    for rel in files:
        for i, at in enumerate(_positions(rel, Path(root, rel).read_bytes())):
            for mask in ((0x01, 0xFF)[i % 2],):
                choice, meta, params = _flip_and_resume(root, rel, at, mask)
                notes = choice.notes()
                assert len(notes) == 1, (rel, at, mask)
                if rel == "latest":
                    assert choice.step == 4 and f"{root}/latest is damaged" in notes[0], (at, notes)
                else:
                    assert choice.step == 2 and meta["step"] == 2 and meta["optimizer_steps"] == 2, (rel, at)
                    assert f"{root}/iter_0000004 is damaged" in notes[0] and "(step 2)" in notes[0], notes
                    assert float(params["w"][5, 0]) == 2.0
                checked += 1
    assert checked > 200
    assert torch.equal(C.read_logical(root)[1]["w"], ref["w"])  # every byte put back


def test_every_checkpoint_damaged_is_one_line(tmp_path):
    from planner.errors import SailorError
    from sailor_ext import checkpoint as C
    from sailor_ext.storage import Storage

    root = str(tmp_path / "ckpt")
    _save(root, 2)
    _save(root, 4)
    storage = Storage(root)
    for name in ("iter_0000002", "iter_0000004"):
        rel = f"{name}/{next(n for n in storage.children(name) if n.startswith('rank00001'))}"
        storage.put(rel, storage.get(rel)[:-4])
    with pytest.raises(SailorError) as caught:
        C.read_logical(root)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"every checkpoint in {root} is damaged")
    assert "iter_0000004" in message and "iter_0000002" in message and "truncated" in message


def test_checkpoints_on_s3(s3_root):
    """The same checkpoint through s3fs on a local S3 server: committed, listed, resumed, damage caught."""
    from sailor_ext import checkpoint as C

    root = f"{s3_root}/unit"
    _save(root, 2)
    _save(root, 4)
    choice, meta, params = C.load_logical(root)
    assert (choice.step, meta["consumed_samples"]) == (4, 48) and float(params["w"][5, 0]) == 4.0
    assert C.claimed(root) == ("iter_0000004", 4)
    for rel in _newest_files(root)[1:]:
        choice, meta, _ = _flip_and_resume(root, rel, 10, 0x01)
        assert choice.step == 2 and "iter_0000004 is damaged" in choice.notes()[0], rel
    choice, _, _ = _flip_and_resume(root, "latest", 20, 0x01)
    assert choice.step == 4 and "latest is damaged" in choice.notes()[0]


@pytest.mark.slow
def test_every_checkpoint_damaged_stops_every_rank_with_one_line(tmp_path):
    """Ranks started as torchrun starts them; both checkpoints of a run damaged: rank 0 alone prints
    one line naming them, every rank exits 2, no traceback anywhere."""
    plan = plan_dict([((0, 5), [1, 1])], [(6, 1), (6, 1)])
    first = run_plan(tmp_path / "a", plan, 2, ["--train-iters", "2", "--save", "ckpt", "--save-interval", "1", *ARGS])
    assert_ok(first)
    ckpt = tmp_path / "a" / "ckpt"
    for name in ("iter_0000001", "iter_0000002"):
        victim = max((ckpt / name).glob("rank*.bin"), key=lambda p: p.stat().st_size)
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0x01
        victim.write_bytes(bytes(data))
    second = run_plan(tmp_path / "b", plan, 2, ["--train-iters", "4", "--load", str(ckpt), *ARGS])
    assert second.returncodes == [2, 2], second.logs
    lines = [line for log in second.logs for line in log.splitlines() if line.startswith("sailor: error:")]
    assert len(lines) == 1 and f"every checkpoint in {ckpt} is damaged" in lines[0], second.logs
    assert "iter_0000002: rank" in lines[0] and "iter_0000001: rank" in lines[0]
    assert not any("Traceback" in log for log in second.logs) and second.metrics == []


def _reseal(root: str, name: str, change) -> None:
    """Rewrite iter `name`'s meta.json, changed by `change(meta)`, sealed again: as another program or a
    hand edit would leave it (its checksum verifies, its fields are wrong), and `latest` to match."""
    from sailor_ext import checkpoint as C
    from sailor_ext.storage import Storage

    storage = Storage(root)
    meta = C.unseal(storage.get(f"{name}/meta.json"))
    change(meta)
    sealed = C.seal(meta)
    storage.put(f"{name}/meta.json", sealed)
    storage.put("latest", f"{name} {C._sha(sealed)}\n".encode())


def _first_tensor(meta):
    return meta["files"][min(meta["files"])]["pieces"][0]["tensors"]["param"]


@pytest.mark.parametrize("change, why", [
    (lambda m: m.pop("step"), "missing field 'step'"),
    (lambda m: m.update(step="4"), "step must be an integer"),
    (lambda m: m.pop("consumed_samples"), "missing field 'consumed_samples'"),
    (lambda m: m.update(files=[]), "files must be an object"),
    (lambda m: m["files"].update({"../../escape.bin": m["files"].pop(min(m["files"]))}), "a rank file's name"),
    (lambda m: _first_tensor(m).update(dtype="int8"), "dtype must be one of float32"),
    (lambda m: _first_tensor(m).update(dtype="bogus"), "dtype must be one of float32"),
    (lambda m: _first_tensor(m).update(shape=[40, 3]), "a shape whose dimension 0 spans the piece's rows 0..4"),
    (lambda m: _first_tensor(m).update(offset=10 ** 9), "an offset that leaves its 48 bytes inside the file"),
    (lambda m: _first_tensor(m).update(sha256=[]), "sha256 must be a list of at least 1 entry"),
], ids=["no-step", "step-text", "no-consumed", "files-list", "file-outside", "dtype-int8", "dtype-bogus",
        "shape", "offset", "no-hashes"])
def test_a_resealed_malformed_meta_falls_back_to_the_previous_checkpoint(tmp_path, change, why):
    """A meta.json whose seal verifies but whose fields do not (another program's, a hand edit): damaged, so the
    previous checkpoint loads and one line says why; it crashed with KeyError/TypeError, or loaded int8 bytes."""
    from sailor_ext import checkpoint as C

    root = str(tmp_path / "ckpt")
    _save(root, 2)
    _save(root, 4)
    _reseal(root, "iter_0000004", change)
    choice, meta, params = C.load_logical(root)
    notes = choice.notes()
    assert choice.step == 2 and len(notes) == 1 and "meta.json is malformed" in notes[0] and why in notes[0], notes
    assert float(params["w"][5, 0]) == 2.0


@pytest.mark.parametrize("make, load, why", [
    (lambda r: None, "ckpt/iter_0000004/meta.json", "no checkpoint in"),
    (lambda r: (r / "latest").unlink() or (r / "latest").mkdir(), "ckpt", "latest is damaged"),
    (lambda r: (r / "latest").unlink() or __import__("os").mkfifo(r / "latest"), "ckpt", "latest is damaged"),
    (lambda r: __import__("shutil").rmtree(r / "iter_0000004") or (r / "iter_0000004").write_text("x"), "ckpt",
     "meta.json is not a file"),
], ids=["load-a-file", "latest-a-directory", "latest-a-fifo", "iteration-a-file"])
def test_a_load_path_of_the_wrong_kind_is_one_line(tmp_path, make, load, why):
    from planner.errors import SailorError
    from sailor_ext import checkpoint as C

    _save(str(tmp_path / "ckpt"), 2)
    _save(str(tmp_path / "ckpt"), 4)
    make(tmp_path / "ckpt")
    try:
        choice = C.choose(str(tmp_path / load))
    except SailorError as e:
        assert why in str(e) and "\n" not in str(e), e
    else:
        assert choice.step == 2 if "iteration" in why or "meta.json" in why else choice.step == 4
        assert any(why in n for n in choice.notes()), choice.notes()


def test_a_checkpoint_of_another_shape_is_one_line(tmp_path):
    """A tensor split along dim 0 with 3 columns, loaded where the model needs 5: refused by name (narrow() crashed)."""
    from planner.errors import SailorError
    from sailor_ext import checkpoint as C

    _save(str(tmp_path / "ckpt"), 2)
    ckpt = C.open_choice(C.choose(str(tmp_path / "ckpt")))
    with pytest.raises(SailorError, match=r"w was saved with shape \(4, 3\) \(split along 0\) but this model needs "
                                          r"\(6, 5\)"):
        ckpt.assemble("w", "param", 0, 0, 6, (6, 5))
    with pytest.raises(SailorError, match=r"b was saved with shape \(3,\) .* needs \(4,\)"):
        ckpt.assemble("b", "param", None, 0, 0, (4,))
