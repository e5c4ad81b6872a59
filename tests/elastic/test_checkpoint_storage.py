"""Checkpoints without a shared filesystem: an elastic job saving to S3 (a local S3-compatible
server, moto, through s3fs), or to the nodes' own disks (node:NAME, a copy of each file on another
node), loses a node, and nothing committed is lost; every checkpoint damaged ends the job with one
line."""
from __future__ import annotations

import shutil

import pytest
from _elastic_helpers import GLOBAL_BATCH, Job

pytestmark = pytest.mark.slow

INTERVAL = 4


def _committed(root: str) -> int:
    """The step of the newest committed checkpoint (0: none yet)."""
    from planner.errors import SailorError
    from sailor_ext import checkpoint as C

    try:
        return C.choose(root).step
    except SailorError:
        return 0


@pytest.mark.timeout(240)
def test_node_loss_with_checkpoints_on_s3(tmp_path, s3_root):
    """Three nodes save to s3:// (nothing on a shared disk). SIGKILL a node right after a checkpoint
    is committed: the survivors resume (from memory), every step is trained once, and every committed
    checkpoint, before and after the kill, still verifies in full from S3."""
    from sailor_ext import checkpoint as C

    iters, root = 12, f"{s3_root}/{tmp_path.name}/ckpt"
    job = Job(tmp_path, ["--train-iters", str(iters), "--save", root, "--save-interval", str(INTERVAL),
                         "--keep-checkpoints", "0", "--dist-timeout", "30", "--seed", "3"])
    try:
        for name in "abc":
            job.add_agent(name)
        job.wait_epoch_started(1)
        job.wait_for(lambda: _committed(root) >= INTERVAL, 120, "a checkpoint committed on S3")
        victim = next(e for e in job.events("epoch_published") if e["epoch"] == 1)["nodes"][-1]
        job.kill_agent(victim)
        assert job.wait(180) == 0, job.log()
    finally:
        job.close()
    assert [e["node"] for e in job.events("node_lost")] == [victim]
    assert sorted({m["step"] for m in job.metrics()}) == list(range(1, iters + 1))
    choice, meta, params = C.load_logical(root)
    assert choice.step == iters and meta["consumed_samples"] == iters * GLOBAL_BATCH and choice.notes() == []
    for step in range(INTERVAL, iters + 1, INTERVAL):  # each committed checkpoint, read and checked whole
        one, meta, _ = C.load_logical(f"{root}/iter_{step:07d}")
        assert meta["step"] == step and meta["optimizer_steps"] == step and one.notes() == [], (step, root)
    assert len(params) > 10


@pytest.mark.timeout(240)
def test_node_loss_with_checkpoints_on_the_nodes_own_disks(tmp_path):
    """Three nodes, each with a directory of its own (--node-dir), save to node:ckpt: no shared
    filesystem, no object store. SIGKILL rank 0's node right after a checkpoint is committed and delete
    its directory (its disk is gone with it): the survivors go on, every step is trained once, and every
    committed checkpoint, before and after the loss, verifies in full from the two surviving disks
    (read through their file servers, as a resuming job reads them)."""
    from planner.elastic.files import FileServer
    from sailor_ext import checkpoint as C
    from sailor_ext import storage

    iters, disks = 12, {n: tmp_path / f"disk-{n}" for n in "abc"}

    def committed() -> int:
        steps = [int(f.read_text().split()[0][len("iter_"):]) for f in
                 (d / "ckpt" / "latest" for d in disks.values()) if f.exists()]
        return max(steps, default=0)

    job = Job(tmp_path, ["--train-iters", str(iters), "--save", "node:ckpt", "--save-interval", str(INTERVAL),
                         "--keep-checkpoints", "0", "--dist-timeout", "30", "--seed", "3"])
    try:
        for name in "abc":
            job.add_agent(name, node_dir=disks[name])
        job.wait_epoch_started(1)
        job.wait_for(lambda: committed() >= INTERVAL, 120, "a checkpoint committed on the nodes' disks")
        victim = next(e for e in job.events("epoch_published") if e["epoch"] == 1)["nodes"][0]  # rank 0's
        # it holds committed files of its own: rank 0's, the checkpoint's meta.json and `latest`
        assert list((disks[victim] / "ckpt").glob("iter_*/meta.json")) and (disks[victim] / "ckpt" / "latest").exists()
        job.kill_agent(victim)
        shutil.rmtree(disks[victim])
        assert job.wait(180) == 0, job.log()
    finally:
        job.close()
    assert [e["node"] for e in job.events("node_lost")] == [victim]
    assert sorted({m["step"] for m in job.metrics()}) == list(range(1, iters + 1))
    first, *others = [n for n in "abc" if n != victim]
    servers = [FileServer(str(disks[n]), host="127.0.0.1") for n in others]
    storage.configure_nodes(str(disks[first]), [(f"http://127.0.0.1:{s.port}", s.token) for s in servers], None)
    try:
        choice, meta, params = C.load_logical("node:ckpt")
        assert choice.step == iters and meta["consumed_samples"] == iters * GLOBAL_BATCH and choice.notes() == []
        for step in range(INTERVAL, iters + 1, INTERVAL):  # each committed checkpoint, read and checked whole
            one, meta, _ = C.load_logical(f"node:ckpt/iter_{step:07d}")
            assert meta["step"] == step and meta["optimizer_steps"] == step and one.notes() == [], step
        assert len(params) > 10
    finally:
        storage._NODES.clear()
        for s in servers:
            s.close()


@pytest.mark.timeout(240)
def test_every_checkpoint_damaged_ends_the_job_in_one_line(tmp_path):
    """Both checkpoints of a run damaged (a rank file cut short, a meta.json byte flipped): `sailor run
    --load` stops with one line naming each, a non-zero exit and no traceback, and trains nothing."""
    from sailor_ext.storage import Storage

    first = Job(tmp_path / "first", ["--train-iters", "4", "--save", "ckpt", "--save-interval", "2",
                                      "--dist-timeout", "30"], global_batch=12, min_gpus=2)
    try:
        first.add_agent("a")
        assert first.wait(120) == 0, first.log()
    finally:
        first.close()
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tmp_path / "first" / "ckpt", ckpt)
    rank_file = max((ckpt / "iter_0000002").glob("rank*.bin"), key=lambda p: p.stat().st_size)
    rank_file.write_bytes(rank_file.read_bytes()[:-1])
    meta = Storage(ckpt).get("iter_0000004/meta.json")
    at = meta.index(b'"step": 4') + len(b'"step": ')
    (ckpt / "iter_0000004" / "meta.json").write_bytes(meta[:at] + b"5" + meta[at + 1:])
    job = Job(tmp_path / "job", ["--train-iters", "6", "--dist-timeout", "30"], global_batch=12, min_gpus=2,
              controller_args=["--load", str(ckpt)])
    code = job.run_with_agent()
    log = job.log()
    errors = [line for line in log.splitlines() if line.startswith("sailor: error:")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in log, log
    assert f"every checkpoint in {ckpt} is damaged" in errors[0]
    assert "iter_0000004: meta.json fails its SHA-256 checksum" in errors[0]
    assert f"iter_0000002: {rank_file.name} has" in errors[0] and "truncated" in errors[0]
    assert job.metrics() == []
