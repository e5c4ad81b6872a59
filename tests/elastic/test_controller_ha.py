"""The controller can die; a frozen worker is found by its own heartbeat.

SIGKILL `sailor run` mid-training: the workers train on, and a controller
started again with the same state (the journal file, or etcd) re-adopts the
job: no worker restarts, no step is lost or repeated, the losses are an
uninterrupted run's. Only one controller may lead a job. A worker frozen
with SIGSTOP while its agent lives is found and the job re-planned within
seconds, with the default settings.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from _elastic_helpers import PYTHON, ROOT, Job, env

pytestmark = pytest.mark.slow

LOSS_RTOL = 1e-5



def assert_refused_in_one_line(refused, leads: str) -> None:
    """A second controller on a led job: exit 2 and one line naming the leader."""
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "another controller" in lines[0] and leads in lines[0]

def train_args(iters: int, save_interval: int = 4) -> list[str]:
    return ["--train-iters", str(iters), "--save", "ckpt", "--save-interval", str(save_interval),
            "--dist-timeout", "60", "--seed", "3"]


def second_controller(job: Job) -> subprocess.CompletedProcess:
    """The same `sailor run` as the job's (the same --state), while its controller lives."""
    cmd = list(job.cmd)
    cmd[cmd.index("--address-file") + 1] = str(job.workdir / "address2")
    return subprocess.run(cmd, cwd=job.workdir, env=env(), capture_output=True, text=True, timeout=60)


def reference_losses(workdir: Path, iters: int) -> dict[int, float]:
    """Step -> loss of the same job, uninterrupted, for `iters` steps (the learning rate does not
    depend on the number of steps, so its losses are any longer run's first ones)."""
    reference = Job(workdir, train_args(iters), global_batch=12, min_gpus=2)
    try:
        reference.add_agent("a")
        assert reference.wait(180) == 0, reference.log()
    finally:
        reference.close()
    expected = {m["step"]: m["loss"] for m in reference.metrics()}
    assert sorted(expected) == list(range(1, iters + 1))
    return expected


def finish(job: Job) -> int:
    """A few more steps under the new controller, then SIGTERM: the job saves and ends; its last step."""
    job.wait_step(max(m["step"] for m in job.metrics()) + 3)
    job.controller.send_signal(signal.SIGTERM)
    assert job.wait(60) == 0, job.log()
    return max(m["step"] for m in job.metrics())


def assert_one_epoch_no_restart(job: Job, iters: int, pids_before: list[int], node: str = "a") -> list[dict]:
    metrics = job.metrics()
    assert [m["step"] for m in metrics] == list(range(1, iters + 1)), "the step counter never goes back or skips"
    assert {m["epoch"] for m in metrics} == {1}, "the running epoch is re-adopted, not re-planned"
    assert job.events("controller_adopted"), job.log()
    assert not job.events("node_lost") and not job.events("worker_lost")
    assert "starting a fresh one" not in job.agent_log(node)
    assert [e["pid"] for e in job.events("node_joined")] == [job.agents[node].pid]
    assert len(set(pids_before)) == 2
    return metrics


@pytest.mark.timeout(240)
def test_controller_killed_and_restarted_from_its_journal(tmp_path):
    """SIGKILL the controller at step 6 and start it again 1 s later (same directory, so the same
    journal): the job goes on in its first epoch, with an uninterrupted run's losses. A second
    controller started while one leads is refused with one line."""
    job = Job(tmp_path / "job", train_args(100_000), global_batch=12, min_gpus=2)
    try:
        job.add_agent("a")
        pids = job.worker_pids("a")
        job.wait_step(6)
        refused = second_controller(job)
        job.controller.kill()
        job.controller.wait()
        time.sleep(1.0)
        job.start_controller()
        last = finish(job)
    finally:
        job.close()
    assert_refused_in_one_line(refused, "leads this job")
    metrics = assert_one_epoch_no_restart(job, last, pids)
    expected = reference_losses(tmp_path / "reference", last)
    for m in metrics:
        assert m["loss"] == pytest.approx(expected[m["step"]], rel=LOSS_RTOL), m
    from sailor_ext.checkpoint import read_logical

    meta, _ = read_logical(job.workdir / "ckpt")
    assert meta["step"] == last, "SIGTERM to the new controller saves the last step"


@pytest.mark.timeout(240)
def test_workers_train_on_through_a_30_s_controller_outage(tmp_path):
    """Nothing but the controller is gone for 30 s: the workers keep stepping the whole time (the
    reconnection has no time limit), checkpoints every 4 steps included (written, not committed, so
    they never hold training up), and a new controller takes the job over where it is."""
    job = Job(tmp_path, train_args(100_000), global_batch=12, min_gpus=2)
    try:
        job.add_agent("a")
        pids = job.worker_pids("a")
        job.wait_step(3)
        job.controller.kill()
        job.controller.wait()
        t_kill = time.time()
        time.sleep(30.0)
        during = [m for m in job.metrics() if m["time"] > t_kill]
        job.start_controller()
        last = max(m["step"] for m in job.metrics())
        job.wait_step(last + 3)
        job.controller.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, job.log()
    finally:
        job.close()
    assert during and during[-1]["time"] - t_kill > 28.0, "the workers stopped training without a controller"
    assert len(during) >= 20
    assert "not committed: no controller answers" in job.agent_log("a")
    metrics = assert_one_epoch_no_restart(job, max(m["step"] for m in job.metrics()), pids)
    from sailor_ext.checkpoint import read_logical

    meta, _ = read_logical(job.workdir / "ckpt")
    assert meta["step"] == metrics[-1]["step"], "SIGTERM to the new controller saves the last step"


@pytest.mark.timeout(240)
def test_training_that_ends_during_an_outage_keeps_its_last_checkpoint(tmp_path):
    """The workers reach the last step while no controller answers: that checkpoint waits for a
    controller (the others of an outage are skipped), and the new one ends the job with it."""
    iters = 30
    job = Job(tmp_path, train_args(iters), global_batch=12, min_gpus=2)
    try:
        job.add_agent("a")
        job.wait_step(iters - 4)
        job.controller.kill()
        job.controller.wait()
        at_kill = max(m["step"] for m in job.metrics())
        deadline = time.monotonic() + 60  # (Job.wait_for stops when the controller is not running)
        while max(m["step"] for m in job.metrics()) < iters and time.monotonic() < deadline:
            time.sleep(0.05)
        reached = max(m["step"] for m in job.metrics())
        time.sleep(1.0)
        job.start_controller()
        assert job.wait(60) == 0, job.log()
    finally:
        job.close()
    assert at_kill < iters and reached == iters, "the training ended during the outage"
    from sailor_ext.checkpoint import read_logical

    meta, _ = read_logical(job.workdir / "ckpt")
    assert meta["step"] == iters, "the last step's checkpoint is committed"
    assert [e["epoch"] for e in job.events("finished")] == [1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd(tmp_path):
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    client, peer = _free_port(), _free_port()
    proc = subprocess.Popen([binary, "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls",
                             f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
                             f"http://127.0.0.1:{peer}", "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
                            stdout=open(tmp_path / "etcd.log", "w"), stderr=subprocess.STDOUT)
    from planner.elastic.etcd import EtcdState

    probe, deadline = EtcdState(f"http://127.0.0.1:{client}", "probe"), time.monotonic() + 30
    while True:
        try:
            probe.load()
            break
        except Exception as e:  # not up yet
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError(f"etcd did not start: {e}\n{(tmp_path / 'etcd.log').read_text()[-2000:]}")
            time.sleep(0.1)
    yield f"etcd://127.0.0.1:{client}/job"
    proc.kill()
    proc.wait()


@pytest.mark.timeout(240)
def test_etcd_a_controller_on_another_port_takes_over(tmp_path, etcd):
    """The job's state in etcd; agents find the controller through it. SIGKILL the controller; a new
    one, serving on another port (as on another machine), takes the job over once the old lease
    expires, with an uninterrupted run's losses. A second controller while one leads is refused with
    one line."""
    job = Job(tmp_path / "job", train_args(100_000), global_batch=12, min_gpus=2, controller_args=["--state", etcd])
    try:
        job.store = etcd
        job.add_agent("a")
        pids = job.worker_pids("a")
        job.wait_step(5)
        refused = second_controller(job)
        old = job.address
        job.controller.kill()
        job.controller.wait()
        job.start_controller()
        assert job.address != old
        last = finish(job)
    finally:
        job.close()
    assert_refused_in_one_line(refused, "leads job 'job'")
    expected = reference_losses(tmp_path / "reference", last)
    for m in assert_one_epoch_no_restart(job, last, pids):
        assert m["loss"] == pytest.approx(expected[m["step"]], rel=LOSS_RTOL), m
    assert not (tmp_path / "job" / "sailor-run.journal").exists(), "the state went to etcd, not to a local journal"


@pytest.mark.timeout(240)
def test_a_frozen_worker_is_found_and_the_job_replanned(tmp_path):
    """SIGSTOP one worker of a node whose agent keeps heartbeating: its own heartbeat stops, and with
    the default settings (0.5 s x 4) the controller has the job re-planned without its node within 5 s
    (the collective timeout is 60 s here); its agent replaces the worker."""
    job = Job(tmp_path, train_args(100_000), min_gpus=4)
    try:
        job.add_agent("a")
        job.add_agent("b")
        job.wait_epoch_started(1)
        plan = next(e for e in job.events("epoch_published") if e["epoch"] == 1)
        victim = plan["nodes"][1]  # not rank 0's node: the metrics keep flowing
        frozen = job.worker_pids(victim)[1]
        job.wait_step(3)
        t_stop = time.time()
        os.kill(frozen, signal.SIGSTOP)
        replanned = job.wait_for(lambda: [e for e in job.events("epoch_published") if e["epoch"] > 1], 30,
                                 "a re-plan")[0]
        start = job.wait_epoch_started(replanned["epoch"], timeout=60)
        job.wait_step(start["step"] + 2, epoch=replanned["epoch"])
        job.controller.send_signal(signal.SIGTERM)
        assert job.wait(60) == 0, job.log()
    finally:
        try:
            os.kill(frozen, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass
        job.close()
    hung = job.events("worker_hung")
    assert [(e["node"], e["pid"]) for e in hung][:1] == [(victim, frozen)], job.log()
    assert hung[0]["t_detect"] - t_stop < 3.0
    assert replanned["t"] - t_stop <= 5.0, (replanned["t"] - t_stop, job.log())
    assert victim not in replanned["nodes"]
    assert start["source"] == "memory"
    assert "killing it" in job.agent_log(victim)


def test_controller_module_names_no_torch():
    """The durable state lives on the controller side, which stays torch-free."""
    out = subprocess.run([PYTHON, "-c", "import sys, planner.elastic.state, planner.elastic.etcd, "
                          "planner.elastic.controller; print('torch' in sys.modules)"],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_journal_survives_a_torn_tail_and_locks(tmp_path):
    """A record cut by the crash is dropped, everything before it kept; a second leader is refused."""
    from planner.elastic.state import Journal
    from planner.errors import SailorError

    path = str(tmp_path / "j")
    j = Journal(path)
    j.lead()
    assert j.load() == {}
    j.put(b"plan/1", b"A")
    j.put(b"epoch", b"1")
    j.delete(b"plan/1")
    j.put(b"fence/n", b"lost")
    with pytest.raises(SailorError, match="another controller .* leads this job"):
        Journal(path).lead()
    j.close()
    with open(path, "ab") as f:
        f.write(b"S\x00\x00\x00\x05\x00\x00")  # torn
    again = Journal(path)
    again.lead()
    assert again.load() == {b"epoch": b"1", b"fence/n": b"lost"}
    again.put(b"x", b"y")
    again.close()
    last = Journal(path)
    last.lead()
    assert last.load() == {b"epoch": b"1", b"fence/n": b"lost", b"x": b"y"}
    last.close()
    assert Path(path).exists()


def test_a_stalled_training_thread_is_reported_and_a_live_one_is_not():
    """The worker's beat thread beats on its own; when the training thread makes no progress for the
    job's stall limit it reports the rank failed (which ends the epoch), once per epoch."""
    import json

    from planner.elastic import protocol as P
    from planner.elastic.store import StoreClient, StoreServer
    from sailor_ext.elastic.worker import Beat

    server = StoreServer()
    server.set(P.LIVENESS, json.dumps({"beat_s": 0.05, "stall_s": 0.5}))
    beat = Beat(StoreClient(*server.address), "n", 0)
    beat.training = (3, 1)
    for _ in range(15):  # a live training thread: progress every 0.1 s, for 1.5 s
        beat.progressed()
        time.sleep(0.1)
    assert server.get(P.failed_key(3, 1)) is None
    beats = int(server.get(P.worker_beat_key("n", 0)))
    assert beats >= 10
    t0 = time.monotonic()
    while server.get(P.failed_key(3, 1)) is None and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert 0.4 <= time.monotonic() - t0 <= 1.5
    assert server.get(P.failed_key(3, 1)).decode().startswith("no training progress for")
    assert int(server.get(P.worker_beat_key("n", 0))) > beats, "it goes on beating"
    server.close()
