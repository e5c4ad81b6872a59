"""Pieces of the elastic runtime, one process each: the store, checkpoint
verification, the reshard schedule, node-to-rank assignment, the join policy."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from planner.elastic import protocol as P
from planner.elastic.replan import Replanner, assign, pays_off
from planner.elastic.store import StoreClient, StoreClosed, StoreServer, StoreTimeout
from planner.errors import SailorError

ROOT = Path(__file__).resolve().parents[2]


# -- the store ----------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_store_operations_and_blocking_reads():
    server = StoreServer()
    host, port = server.address
    a, b = StoreClient(host, port), StoreClient(host, port)
    try:
        a.set("k", b"v")
        assert b.get("k", 1.0) == b"v" and b.check(["k"]) and not b.check(["k", "missing"])
        assert a.add("n", 2) == 2 and b.add("n", 3) == 5
        assert a.compare_set("c", "", "x") == b"x"  # absent + expected empty: set
        assert a.compare_set("c", "y", "z") == b"x"  # mismatch: current value back
        assert a.compare_set("c", "x", "z") == b"z"
        with pytest.raises(StoreTimeout):
            a.get("late", 0.1)
        threading.Timer(0.2, lambda: server.set("late", "here")).start()
        start = time.monotonic()
        assert b.get("late", 5.0) == b"here" and time.monotonic() - start < 2.0  # woken, not polled
        assert sorted(a.keys("")) == ["c", "k", "late", "n"] and a.delete("k") and not a.check(["k"])
    finally:
        a.close(), b.close(), server.close()


@pytest.mark.timeout(30)
def test_store_reports_a_dropped_connection_at_once():
    gone = []
    server = StoreServer(on_disconnect=lambda who: gone.append((who, time.monotonic())))
    host, port = server.address
    child = subprocess.Popen([sys.executable, "-c", f"import sys,time; sys.path.insert(0, {str(ROOT)!r}); "
                              "from planner.elastic.store import StoreClient; "
                              f"c = StoreClient('{host}', {port}, 'agent/n1'); print('up', flush=True); "
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        killed = time.monotonic()
        child.kill()
        child.wait()
        deadline = time.monotonic() + 5
        while not gone and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gone and gone[0][0] == "agent/n1" and gone[0][1] - killed < 0.5
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_a_second_connection_with_the_same_identity_is_no_loss():
    """A second agent with a node id already in the job is refused and exits: the node whose id it took was
    reported lost and fenced. A loss is when the identity's last connection closes."""
    gone = []
    server = StoreServer(on_disconnect=gone.append)
    host, port = server.address
    first, second = StoreClient(host, port, "agent/n1"), StoreClient(host, port, "agent/n1")
    try:
        second.close()
        time.sleep(0.3)
        assert gone == [] and first.add("k", 1) == 1
        first.close()
        deadline = time.monotonic() + 5
        while not gone and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gone == ["agent/n1"]
    finally:
        server.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("greeting", [b"SSH-2.0-OpenSSH_9.6\r\n", b"", None],
                         ids=["another protocol", "closes at once", "never answers"])
def test_a_port_that_is_not_a_store_fails_at_connect(greeting):
    """`sailor agent --store` at any other service hung for good: a 4-byte 'length' of 1.4 GB was waited for."""
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            if greeting is not None:
                conn.sendall(greeting)
                if not greeting:
                    conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        start = time.monotonic()
        with pytest.raises(StoreClosed, match="cannot reach the job's store"):
            StoreClient("127.0.0.1", listener.getsockname()[1], "agent/n1", connect_timeout=1.0)
        assert time.monotonic() - start < 10
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_planner_side_never_imports_torch():
    code = ("import sys; import planner.elastic.controller, planner.elastic.agent, planner.elastic.replan; "
            "import planner.cli; planner.cli.build_parser(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# -- checkpoints on disk --------------------------------------------------------------------
def _write_checkpoint(save, step: int, value: float) -> None:
    import torch

    from sailor_ext import checkpoint as C
    from sailor_ext.storage import Storage

    storage = Storage(save)
    pieces = [C.Piece("w", 0, 0, 4, {"param": torch.full((4, 3), value)}),
              C.Piece("b", None, 0, 0, {"param": torch.full((3,), value)})]
    record = C.write_pieces(storage, step, 0, pieces)
    C.commit(storage, step, [record], {"consumed_samples": step * 12, "optimizer_steps": step,
                                       "optimizer_state": []}, keep=3)


@pytest.mark.parametrize("damage", ["truncate", "append", "flip", "no-meta", "missing-file"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage):
    from sailor_ext import checkpoint as C

    save = tmp_path / "ckpt"
    for step in (2, 4, 6):
        _write_checkpoint(save, step, float(step))
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000002", "iter_0000004", "iter_0000006", "latest"]
    newest = save / "iter_0000006"
    rank_file = next(newest.glob("rank00000-*.bin"))
    if damage == "truncate":
        rank_file.write_bytes(rank_file.read_bytes()[:-10])
    elif damage == "append":
        rank_file.write_bytes(rank_file.read_bytes() + b"\0")
    elif damage == "flip":
        data = bytearray(rank_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        rank_file.write_bytes(bytes(data))
    elif damage == "no-meta":
        (newest / "meta.json").unlink()
    else:
        rank_file.unlink()
    choice, meta, params = C.load_logical(str(save))
    assert choice.name == "iter_0000004" and meta["step"] == 4 and float(params["w"][0, 0]) == 4.0
    note = choice.notes()[0]
    assert "iter_0000006 is damaged" in note and "resuming from" in note and "(step 4)" in note


def test_a_checkpoint_becomes_visible_only_when_committed(tmp_path):
    import torch

    from sailor_ext import checkpoint as C
    from sailor_ext.storage import Storage

    save = tmp_path / "ckpt"
    _write_checkpoint(save, 2, 2.0)
    C.write_pieces(Storage(save), 4, 0, [C.Piece("w", 0, 0, 4, {"param": torch.zeros(4, 3)})])
    C.write_pieces(Storage(save), 3, 0, [C.Piece("w", 0, 0, 4, {"param": torch.zeros(4, 3)})])
    choice = C.choose(str(save))
    assert choice.step == 2 and choice.notes() == []  # the unfinished saves of steps 3 and 4 are no damage
    _write_checkpoint(save, 4, 4.0)  # a later epoch commits step 4: its leftover file and the unfinished step 3 go
    assert C.choose(str(save)).step == 4 and not (save / "iter_0000003").exists()
    assert len(list((save / "iter_0000004").glob("*.bin"))) == 1


def test_every_checkpoint_damaged_is_one_clear_error(tmp_path):
    from planner.errors import SailorError
    from sailor_ext import checkpoint as C

    save = tmp_path / "ckpt"
    _write_checkpoint(save, 2, 2.0)
    next((save / "iter_0000002").glob("rank*.bin")).write_bytes(b"junk")
    with pytest.raises(SailorError, match="every checkpoint in .* is damaged"):
        C.read_logical(str(save))


def test_a_checkpoint_of_the_previous_format_is_one_clear_error(tmp_path):
    import json

    from planner.errors import SailorError
    from sailor_ext import checkpoint as C

    old = tmp_path / "ckpt" / "iter_0000002"
    old.mkdir(parents=True)
    (old / "meta.json").write_text(json.dumps({"format": C.FORMAT, "version": 2, "step": 2, "files": {}}))
    (old.parent / "latest").write_text("iter_0000002\n")
    with pytest.raises(SailorError, match="has format version 2; this sailor reads version 3"):
        C.choose(str(old.parent))


# -- resharding from memory -------------------------------------------------------------------
def test_reshard_schedule_covers_every_need_from_the_newest_common_step():
    from sailor_ext.elastic.reshard import Held, Need, StepInfo, plan_transfers

    shape = (8, 4)

    def held(step, start, stop):
        return Held(step, "w", 0, start, stop, "w.local", shape)

    def need(start, stop):
        return Need("w", 0, start, stop, (stop - start, 4), "w.mine", shape)

    info = {s: StepInfo(s, s * 12, s, ("exp_avg",)) for s in (4, 8)}
    # old plan TP 2 on ranks 0, 1 (rows 0..3, 4..7) with snapshots of steps 4 and 8; rank 2 is new.
    holdings = [[held(4, 0, 4), held(8, 0, 4)], [held(4, 4, 8), held(8, 4, 8)], []]
    infos = [[info[4], info[8]], [info[4], info[8]], []]
    # new plan: TP 1 on rank 2 (all rows), TP 2 on ranks 0, 1 swapped
    needs = [[need(4, 8)], [need(0, 4)], [need(0, 8)]]
    chosen, transfers = plan_transfers(holdings, infos, needs, nodes=[0, 0, 1])
    assert chosen.step == 8 and chosen.consumed == 96
    got = {(t.src, t.dst, t.src_offset, t.dst_offset, t.length) for t in transfers}
    assert got == {(1, 0, 0, 0, 4), (0, 1, 0, 0, 4), (0, 2, 0, 0, 4), (1, 2, 0, 4, 4)}
    # rank 1 lost its step-8 snapshot: only step 4 covers every need
    holdings[1] = [held(4, 4, 8)]
    assert plan_transfers(holdings, infos, needs, nodes=[0, 0, 1])[0].step == 4
    # nothing newer than what the disk has: fall back to the disk
    assert plan_transfers(holdings, infos, needs, nodes=[0, 0, 1], min_step=5) is None
    # nobody holds rows 4..7 any more
    holdings[1] = []
    assert plan_transfers(holdings, infos, needs, nodes=[0, 0, 1]) is None


def test_reshard_cuts_a_wider_old_slice_at_the_right_offset():
    from sailor_ext.elastic.reshard import Held, Need, StepInfo, plan_transfers

    shape = (8, 4)
    # old plan TP 1 (rank 0 holds all rows); new plan TP 4: rank r needs rows 2r..2r+1
    holdings = [[Held(6, "w", 0, 0, 8, "w", shape)], [], [], []]
    infos = [[StepInfo(6, 72, 6, ())], [], [], []]
    needs = [[Need("w", 0, 2 * r, 2 * r + 2, (2, 4), "w", shape)] for r in range(4)]
    _, transfers = plan_transfers(holdings, infos, needs, nodes=[0, 0, 0, 0])
    assert sorted((t.dst, t.src, t.src_offset, t.dst_offset, t.length) for t in transfers) == \
        [(r, 0, 2 * r, 0, 2) for r in range(4)]


def test_reshard_prefers_a_local_copy_then_the_same_node():
    from sailor_ext.elastic.reshard import Held, Need, StepInfo, plan_transfers

    shape = (6,)
    whole = [Held(3, "bias", None, 0, 0, "b", shape)]
    needs = [[Need("bias", None, 0, 0, shape, "b", shape)]] * 3
    infos = [[StepInfo(3, 36, 3, ())]] * 3
    _, transfers = plan_transfers([whole, whole, []], infos, needs, nodes=[0, 1, 1])
    assert {(t.src, t.dst) for t in transfers} == {(0, 0), (1, 1), (1, 2)}


# -- from nodes to ranks ----------------------------------------------------------------------
def _replanner(global_batch=12) -> Replanner:
    from planner.profiles.store import load_profiles
    from planner.search.goal import Goal
    from planner.specs.hardware import load_cluster
    from planner.specs.model import get_model

    cluster = load_cluster(None)
    model = get_model("tiny")
    return Replanner(model, cluster, load_profiles(None, dict(cluster.gpus), model.name), global_batch, Goal())


def test_plans_follow_the_nodes_present():
    replanner = _replanner()
    nodes = [P.NodeInfo(n, "CPU", "local", 2) for n in ("a", "b", "c")]
    three = replanner.propose(nodes)
    assert sorted(three.nodes) == ["a", "b", "c"] and len(three.ranks) == 6
    assert three.gpus_per_node == {"CPU": 2}
    # every worker of every node used once, TP groups inside a node
    assert sorted(three.ranks) == [(n, i) for n in "abc" for i in range(2)]
    two = replanner.propose(nodes[1:])
    assert sorted(two.nodes) == ["b", "c"] and three.iteration_time_s < two.iteration_time_s
    assert replanner.propose([]) is None


def test_layout_nodes_map_onto_nodes_of_the_same_type_and_zone():
    from planner.specs.plan import plan_from_dict

    plan = plan_from_dict({"format": "sailor-plan", "version": 1, "model": "tiny", "global_batch_size": 4,
                           "stages": [{"layers": [0, 5], "replicas": [
                               {"gpu": "CPU", "tp": 2, "zone": "z1"}, {"gpu": "CPU", "tp": 2, "zone": "z2"}]}],
                           "pipelines": [{"microbatch_size": 2, "num_microbatches": 1}] * 2})
    nodes = [P.NodeInfo("far", "CPU", "z2", 2), P.NodeInfo("near", "CPU", "z1", 2)]
    replanner = _replanner()
    ranks = assign(plan, replanner.cluster_for(nodes), nodes)
    assert ranks == (("near", 0), ("near", 1), ("far", 0), ("far", 1))


def test_nodes_of_different_sizes_seat_every_rank():
    """An 8-worker and a 1-worker node: plans are made for 1-GPU nodes, and one using all 9 must seat 8 ranks on
    the big node (each layout node took a real node of its own: "needs a node of 1 x CPU that is not present")."""
    from planner.specs.plan import plan_from_dict

    plan = plan_from_dict({"format": "sailor-plan", "version": 1, "model": "tiny", "global_batch_size": 9,
                           "stages": [{"layers": [0, 5], "replicas": [{"gpu": "CPU", "tp": 1, "zone": "local",
                                                                       "count": 9}]}],
                           "pipelines": [{"microbatch_size": 1, "num_microbatches": 1, "count": 9}]})
    nodes = [P.NodeInfo("big", "CPU", "local", 8), P.NodeInfo("small", "CPU", "local", 1)]
    ranks = assign(plan, _replanner().cluster_for(nodes), nodes)
    assert sorted(ranks) == sorted([("big", i) for i in range(8)] + [("small", 0)])
    assert _replanner(global_batch=9).propose(nodes) is not None


def test_plans_keep_to_the_tp_degrees_the_vocabulary_padding_allows():
    replanner = _replanner()
    replanner.max_tp = 1
    plan = replanner.propose([P.NodeInfo(n, "CPU", "local", 2) for n in ("a", "b")]).plan
    assert {r.tp for s in plan.stages for r in s.replicas} == {1}


def test_a_resumed_job_keeps_its_checkpoints_vocabulary_padding(tmp_path):
    from planner.elastic.controller import job_vocabulary

    assert job_vocabulary(512, 128, 8, None) == (1024, 8)
    (tmp_path / "iter_0000002").mkdir()
    (tmp_path / "iter_0000002" / "meta.json").write_text(json.dumps({"padded_vocab": 512}))
    (tmp_path / "latest").write_text("iter_0000002\n")
    assert job_vocabulary(512, 128, 8, str(tmp_path)) == (512, 4)


@pytest.mark.parametrize("latest", ["garbage", "directory", "missing-iter"])
def test_a_damaged_latest_keeps_the_padding_of_the_newest_readable_checkpoint(tmp_path, latest):
    """The workers fall back from a damaged `latest` to the newest checkpoint that verifies
    (checkpoint.choose); the job's padding must be that checkpoint's, not the default (1024 here)."""
    from planner.elastic.controller import job_vocabulary

    for step, meta in ((2, {"padded_vocab": 512}), (3, {"sha256": "0" * 64, "meta": {"padded_vocab": 512}})):
        (tmp_path / f"iter_000000{step}").mkdir()
        (tmp_path / f"iter_000000{step}" / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "iter_0000004").mkdir()  # an unfinished save: no meta.json
    (tmp_path / "iter_0000005").mkdir()
    (tmp_path / "iter_0000005" / "meta.json").write_text("{torn")
    if latest == "directory":
        (tmp_path / "latest").mkdir()
    else:
        (tmp_path / "latest").write_text("garbage\n" if latest == "garbage" else "iter_0000009 " + "0" * 64 + "\n")
    assert job_vocabulary(512, 128, 8, str(tmp_path)) == (512, 4)


def test_a_joining_node_is_worth_it_only_if_it_saves_more_than_the_switch():
    assert pays_off(current_s=0.20, proposed_s=0.15, remaining_steps=100, reconfigure_s=2.0)  # saves 5 s
    assert not pays_off(current_s=0.20, proposed_s=0.15, remaining_steps=30, reconfigure_s=2.0)  # saves 1.5 s
    assert not pays_off(current_s=0.20, proposed_s=0.25, remaining_steps=10**6, reconfigure_s=0.0)


def test_assignment_round_trips_through_json():
    a = P.Assignment(3, {"x": 1}, (("n1", 0), ("n1", 1), ("n2", 0)), 1024, {"CPU": 2}, "ckpt")
    b = P.Assignment.from_json(a.to_json())
    assert b == a and b.rank_of("n2", 0) == 2 and b.rank_of("n3", 0) is None and b.node_index(2) == 1


def test_provider_list_file_and_command(tmp_path):
    from planner.elastic.provider import Answer, ask

    def ids(path, command=None):
        return ask(path, command).ids

    f = tmp_path / "nodes"
    f.write_text("# the VMs that exist\na\nb\n\n")
    assert ids(str(f)) == {"a", "b"}
    f.write_text(json.dumps(["x", "y"]))
    assert ids(str(f)) == {"x", "y"}
    assert ids(None, "printf 'n1\\nn2\\n'") == {"n1", "n2"}
    assert ask(str(tmp_path / "missing"), None) == Answer(None, "No such file or directory")  # the last list stands
    f.write_bytes(b"\xff\x00\xff")
    assert ask(str(f), None).why == "not UTF-8 text"  # (now): not a crash of the controller
    assert ids(None, "printf '\\377'") is None and ids(None, "'unbalanced") is None
    assert ask(None, "sh -c 'echo quota exceeded >&2; exit 3'").why == "exit 3: quota exceeded"
    f.write_text("\ufeffnode0\n")  # an editor's byte-order mark: not part of the first id
    assert ids(str(f)) == {"node0"}


@pytest.mark.timeout(30)
def test_a_provider_command_under_way_is_killed_when_the_controller_stops(tmp_path):
    """A hook still asking when the controller ended ran on after it (to its end, or forever), its
    children too: it is killed with its process group."""
    from _elastic_helpers import alive

    from planner.elastic.provider import ProviderWatch

    pids = tmp_path / "pids"
    watch = ProviderWatch(None, f"sh -c 'echo $$ > {pids}; sleep 60 & echo $! >> {pids}; wait'", 0.01)
    watch.start()
    deadline = time.monotonic() + 10
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    shell, child = map(int, pids.read_text().split())
    watch.close()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in (shell, child)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(shell) and not alive(child)


def test_a_provider_command_that_hangs_is_cut_off_and_named(monkeypatch):
    """It printed subprocess's own "Command '[...]' timed out after 10 seconds"."""
    from planner.elastic import provider

    monkeypatch.setattr(provider, "COMMAND_TIMEOUT_S", 0.2)
    with pytest.raises(SailorError, match=r"^--nodes-command 'sleep 5' cannot be read at start \(no answer within "
                                          r"0.2 s\); it must list"):
        provider.check_provider(None, "sleep 5")


@pytest.mark.parametrize("content, why", [
    ("[" * 200_000, "nested too deeply"), ('[{"a": 1}, null]', "not of node id strings"), ("[NaN]", "not of node id"),
    ("\n".join(f"n{i}" for i in range(70_000)), "more than 65536 node ids"), (None, "not a regular file"),
])
def test_a_provider_list_that_cannot_be_one_is_refused_at_start(tmp_path, content, why):
    """A deep JSON list ended in 'internal error: RecursionError'; a pipe blocked the controller for good."""
    from planner.elastic.provider import check_provider

    f = tmp_path / "nodes"
    if content is None:
        os.mkfifo(f)
    else:
        f.write_text(content)
    with pytest.raises(SailorError, match=f"--nodes-file {f} cannot be read at start \\(.*{why}"):
        check_provider(str(f), None)



class Events:
    """The controller's event log, kept for the test to read."""

    def __init__(self):
        self.records, self.keep, self.count = [], None, 0

    def emit(self, event: str, message: str = "", **fields) -> None:
        self.records.append({"event": event, "message": message, **fields})

    def named(self, event: str) -> list[dict]:
        return [r for r in self.records if r["event"] == event]


def test_provider_drains_a_node_only_when_two_polls_in_a_row_miss_it(tmp_path):
    """One poll that misses a node (a list read while half-written, a cloud API's short page) must not
    drain it: a drain cannot be undone. Two polls in a row that miss it do; an unreadable poll changes
    nothing, and is reported once per spell of failures."""
    from planner.elastic.controller import Controller, NodeState, Settings
    from planner.elastic.provider import ask

    nodes = tmp_path / "nodes"
    events = Events()
    controller = Controller(Settings([], 1, provider_file=str(nodes), provider_interval_s=1.0), None, events)
    for i in range(3):
        controller.nodes[f"node{i}"] = NodeState(P.NodeInfo(f"node{i}", "CPU", "local", 8), 0.0)

    def poll(text: str | None) -> list[str]:
        if text is None:
            nodes.unlink(missing_ok=True)
        else:
            nodes.write_text(text)
        controller._apply_provider(ask(str(nodes), None))
        return [n for n, state in controller.nodes.items() if state.leaving]

    try:
        assert poll("node0\nnode2\n") == []  # missed once
        assert poll("node0\nnode1\nnode2\n") == []  # back: the miss is forgotten
        assert poll("") == []  # an empty list, once
        assert poll("node0\nnode2\n") == ["node1"]  # node1 missed twice in a row
        assert poll(None) == ["node1"] and poll(None) == ["node1"]  # unreadable: the last list stands
        assert [e["reason"] for e in events.named("provider_error")] == ["No such file or directory"]
        assert poll("node2\n") == ["node1"]
        assert events.named("provider")[-1]["listed"] == ["node2"]
        assert poll("node2\n") == ["node0", "node1"]
        assert [e["node"] for e in events.named("node_leaving")] == ["node1", "node0"]
    finally:
        controller.server.close()


def test_provider_events_name_ten_missing_ids_and_count_the_rest():
    """3 M ids once made a 37 MB line on stderr and 44 MB in the events file and the journal."""
    from planner.elastic.controller import Controller, Settings
    from planner.elastic.provider import Answer

    events = Events()
    controller = Controller(Settings([], 1, provider_command="list-vms"), None, events)
    try:
        controller._apply_provider(Answer(frozenset(f"vm{i:02d}" for i in range(25))))
    finally:
        controller.server.close()
    (event,) = events.named("provider")
    assert event["message"].endswith("not joined yet: vm00, vm01, vm02, vm03, vm04, vm05, vm06, vm07, vm08, vm09 "
                                     "and 15 more")
    assert event["count"] == 25 and "listed" not in event


@pytest.mark.timeout(30)
def test_a_provider_hook_that_hangs_does_not_stall_the_controller(tmp_path):
    """The hook was asked on the controller's loop: a cloud API that hung held off the detection of
    lost nodes for up to 10 s per poll. It is asked on a thread of its own; the loop takes answers."""
    from planner.elastic.provider import ProviderWatch

    gate = tmp_path / "gate"
    watch = ProviderWatch(None, f"sh -c 'while [ ! -e {gate} ]; do sleep 0.05; done; echo node0'", 0.01)
    watch.start()
    try:
        t0 = time.monotonic()
        assert watch.take() is None and time.monotonic() - t0 < 1.0  # the hook is still asking: no wait
        gate.touch()
        deadline = time.monotonic() + 10
        while (answer := watch.take()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answer is not None and answer.ids == {"node0"}
    finally:
        watch.close()


# -- sailor run: the workers' arguments ---------------------------------------------------------
def _job_args(precision, *rest):
    import argparse

    return argparse.Namespace(rest=["--", "--train-iters", "1", *rest], model="tiny", local=False, node_dirs=None,
                              load=None, precision=precision)


@pytest.mark.parametrize("precision, given, flag", [
    ("bf16", [], "--bf16"), ("fp16", [], "--fp16"), ("fp32", [], "--no-bf16"), (None, [], None),
    ("bf16", ["--bf16"], None), ("fp32", ["--no-bf16"], None), ("fp16", ["--fp16"], None),
])
def test_the_workers_train_in_the_jobs_precision(precision, given, flag):
    """sailor run --precision sizes every plan for that precision: the workers get its flag, as
    `sailor launch` gives a plan's (a flag already there is not repeated)."""
    from planner.elastic.controller import _train_args
    from planner.specs.model import get_model

    rest, _, _ = _train_args(_job_args(precision, *given), get_model("tiny"))
    assert rest == ([flag] if flag else []) + ["--train-iters", "1", *given]


def test_a_training_flag_that_contradicts_the_jobs_precision_is_refused():
    from planner.elastic.controller import _train_args
    from planner.errors import SailorError
    from planner.specs.model import get_model

    for precision, given in (("bf16", "--no-bf16"), ("fp32", "--bf16"), ("bf16", "--fp16"), ("fp16", "--bf16")):
        with pytest.raises(SailorError, match=f"--precision {precision} contradicts the training argument {given} "):
            _train_args(_job_args(precision, given), get_model("tiny"))


# -- sailor run: its journal (--state) ----------------------------------------------------------
def _sailor_run(cwd, *extra, code="from planner.cli import main; sys.exit(main())"):
    # start_local_agents exits: a test of a refusal never starts agents, even on code that does not refuse
    code = ("import sys; sys.path.insert(0, %r); from planner.elastic.controller import Controller; "
            "Controller.start_local_agents = lambda *a, **k: sys.exit('started agents'); " % str(ROOT)) + code
    return subprocess.run([sys.executable, "-c", code, "run", "--model", "tiny", "--global-batch", "2", *extra],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def _one_error(out, fragment):
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("sailor: error:")]
    assert len(errors) == 1 and fragment in errors[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("extra, fragment", [
    (["--state", "notes.txt"], "--state notes.txt exists and is not a sailor run journal; give a new file"),
    (["--state", "c.yaml", "--cluster", "c.yaml"], "--state c.yaml is also an input of this command"),
    (["--state", "ck/latest", "--load", "ck"], "--state ck/latest would replace a file in ck"),
    (["--state", "events", "--events-file", "events"], "--state events is also an input of this command"),
    (["--state", "j", "--cluster", "j.lock"], "--state's lock file j.lock is also an input of this command"),
])
def test_sailor_run_never_writes_its_journal_over_another_file(tmp_path, extra, fragment):
    """The journal is rewritten at start: over a user's notes, the job's own cluster file or a
    checkpoint's `latest` that was data loss (and a cluster file destroyed before the agents read it)."""
    files = {"notes.txt": "my notes\n" * 20, "c.yaml": "gpus: {}\n", "ck/latest": "iter_0000003 " + "0" * 64 + "\n",
             "events": '{"event": "x"}\n', "j.lock": "{\"gpus\": {}}\n"}
    (tmp_path / "ck").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    _one_error(_sailor_run(tmp_path, *extra, "--wait-s", "1", "--", "--train-iters", "1"), fragment)
    assert {name: (tmp_path / name).read_text() for name in files} == files


def test_the_journal_refuses_a_file_it_did_not_write(tmp_path):
    """A journal starts with its MAGIC (or, written before it, with a whole record); any other file
    is refused, not parsed up to its first "torn record" and replaced."""
    import struct

    from planner.elastic.state import MAGIC, Journal
    from planner.errors import SailorError

    notes = tmp_path / "notes"
    notes.write_text("S my notes\n" * 5)
    j = Journal(str(notes))
    j.lead()
    with pytest.raises(SailorError, match="exists and is not a sailor run journal"):
        j.load()
    j.close()
    assert notes.read_text() == "S my notes\n" * 5
    new = Journal(str(tmp_path / "new"))
    new.lead()
    assert new.load() == {} and (tmp_path / "new").read_bytes() == MAGIC
    new.close()
    old = tmp_path / "old"  # a journal of the previous format: no MAGIC
    old.write_bytes(struct.pack("!cII", b"S", 5, 1) + b"epoch1" + struct.pack("!cII", b"S", 3, 9) + b"plan")
    j = Journal(str(old))
    j.lead()
    assert j.load() == {b"epoch": b"1"}  # (and the torn second record dropped)
    j.close()
    assert old.read_bytes().startswith(MAGIC)


@pytest.mark.timeout(30)
def test_a_worker_heartbeat_ends_in_one_line_when_the_store_is_gone(capfd):
    """The heartbeat thread printed a traceback when the controller was gone for good; the agent
    stops the worker then, so one line is all there is to say."""
    from sailor_ext.elastic.worker import Beat

    server = StoreServer()
    client = StoreClient(*server.address)  # no way to find the store again: a drop is final
    try:
        beat = Beat(client, "node0", 0)
        deadline = time.monotonic() + 5
        while server.get(P.worker_beat_key("node0", 0)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        client.sock.shutdown(socket.SHUT_RDWR)
        beat.thread.join(5)
        assert not beat.thread.is_alive()
    finally:
        server.close()
    err = capfd.readouterr().err
    assert err.count("sailor: heartbeat stopped: lost the job's store") == 1 and "Traceback" not in err, err


@pytest.mark.timeout(30)
def test_a_job_that_ends_in_an_error_tells_its_agents(tmp_path):
    """An agent learns that the job is over from job/done; a job that ended in an error did not set it,
    and its agents reconnected, with their workers, for as long as --controller-wait-s allowed."""
    from planner.elastic.controller import Controller, EventLog, NodeState, Settings

    controller = Controller(Settings([], 1, wait_s=0.0), None, EventLog(None, quiet=True))
    agent = StoreClient(*controller.address, identity=P.agent_identity("node0"))
    controller.nodes["node0"] = NodeState(P.NodeInfo("node0", "CPU", "local", 8), 0.0,
                                          beat_at=time.monotonic() + 1e6)
    told = []

    def agent_loop():
        agent.wait([P.JOB_DONE], 10.0)
        told.append(time.monotonic())
        agent.close()  # the agent stops its workers and leaves

    thread = threading.Thread(target=agent_loop, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(SailorError, match="no plan could run"):
            controller.run()
        ended = time.monotonic()
    finally:
        controller.server.close()
    thread.join(1)
    assert told and ended - t0 < 5.0, "the controller waits for its agents to leave, not for 10 s"
    assert told[0] <= ended


def test_an_events_file_that_cannot_be_written_names_itself():
    from planner.elastic.controller import EventLog

    if not Path("/dev/full").is_char_device():
        pytest.skip("needs /dev/full")
    log = EventLog("/dev/full", quiet=True)
    with pytest.raises(SailorError, match=r"^cannot write --events-file /dev/full \(No space left on device\); "
                                          r"free space or give another file$"):
        log.emit("job_start")


# -- sailor run --local: the size of the job on one machine ------------------------------------
def test_local_refuses_more_workers_than_the_machine_can_take(tmp_path):
    import os

    many = max(64, 8 * (os.cpu_count() or 1)) + 8  # (whole nodes of 8 CPU "GPUs": a plan runs on them)
    out = _sailor_run(tmp_path, "--local", "--gpus", f"CPU@local={many}", "--wait-s", "1", "--", "--train-iters", "1")
    _one_error(out, f"would start {many} worker processes ({many // 8} agents) on this machine")


def _waits_out(settings, nodes: list, match: str) -> None:
    """A controller holding `nodes` (NodeState, none of them missing heartbeats) ends its wait for a plan
    with a SailorError matching `match`."""
    from planner.elastic.controller import Controller, EventLog

    controller = Controller(settings, None, EventLog(None, quiet=True))
    controller.nodes = {n.info.id: n for n in nodes}
    controller.provider = None  # (no list is read here: the nodes say what the provider did)
    controller._await_agents = lambda limit_s: None  # (no agent is connected to wait for)
    try:
        with pytest.raises(SailorError, match=match):
            controller.run()
    finally:
        controller.server.close()


def _node(i: int, **state):
    from planner.elastic.controller import NodeState

    return NodeState(P.NodeInfo(f"node{i}", "CPU", "local", 8), 0.0, beat_at=time.monotonic() + 1e6, **state)


def test_waiting_out_names_nodes_that_joined_but_are_not_ready():
    """After --wait-s without a plan, "nodes present: none" hid nodes that joined but whose workers
    never became ready (an overloaded machine)."""
    from planner.elastic.controller import Settings

    _waits_out(Settings([], 1, wait_s=0.0), [_node(i) for i in range(3)],
               r"nodes present: none; joined but their workers not ready: node0, node1, node2\)")


def test_waiting_out_names_the_nodes_the_provider_drained():
    """A provider list that names none of the nodes (an empty file, the cloud's ids in another form)
    drains every node that joins; after --wait-s the job ended with "nodes present: none" alone."""
    from planner.elastic.controller import Settings

    _waits_out(Settings([], 1, wait_s=0.0, provider_file="vms.txt"), [_node(i, ready=True, leaving=True)
                                                                     for i in range(2)],
               r"nodes present: none; drained, as --nodes-file vms.txt does not list them: node0, node1\)")


# -- bad input: one line, non-zero exit ---------------------------------------------------------
@pytest.mark.parametrize("extra, fragment", [
    (["--", "--train-iters", "5", "--plan", "p.json"], "--plan is decided by the planner"),
    (["--", "--train-iters", "5", "--micro-batch-size", "2"], "--micro-batch-size is decided by the planner"),
    (["--max-tp", "3", "--", "--train-iters", "5"], "--max-tp 3 must be a power of two"),
    (["--local", "--", "--train-iters", "5"], "--local needs --gpus"),
    (["--load", "/nonexistent", "--", "--train-iters", "5"], "no checkpoint in /nonexistent"),
    (["--load", "node:ckpt", "--", "--train-iters", "5"], "are resumed from --save"),
    (["--gpus", "CPU@local=2", "--local", "--", "--train-iters", "5", "--save", "node:ckpt"], "give --node-dirs DIR"),
    (["--node-dirs", "d", "--", "--train-iters", "5"], "--node-dirs names the disks of the agents --local starts"),
    (["--", "--train-iters", "5", "--save", "node:../x"], "give node:NAME"),
    (["--", "--train-iters", "5", "--save", "README.md/ckpt"], "README.md is a file, not a directory"),
    # (os.access says yes to root there; the first save failed, after training)
    (["--", "--train-iters", "5", "--save", "/proc/ckpt"], "--save /proc/ckpt: cannot create a file in /proc"),
    (["--", "--train-iters", "5", "--load", "ckpt"], "--load ckpt after '--' would be ignored"),  # (it was)
    (["--", "--train-iters", "5", "--lr", "nan"], "bad training arguments after '--': argument --lr: must be"),
    (["--precision", "bf16", "--", "--train-iters", "5", "--no-bf16"],
     "--precision bf16 contradicts the training argument --no-bf16 after '--'; drop one of them"),
    (["--gpus", "CPU@local=2", "--local", "--node-dirs", "/etc/passwd/d", "--", "--train-iters", "5", "--save",
      "node:ckpt"], "--node-dirs /etc/passwd/d: cannot create it"),
])
def test_sailor_run_refuses_bad_input_in_one_line(extra, fragment):
    out = subprocess.run([sys.executable, "-m", "planner.cli", "run", "--model", "tiny", "--global-batch", "12",
                          *extra], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("sailor: error:")]
    assert len(errors) == 1 and fragment in errors[0], out.stderr
    assert "Traceback" not in out.stderr


def test_agent_with_a_bad_store_address_says_so():
    out = subprocess.run([sys.executable, "-m", "planner.cli", "agent", "--store", "localhost", "--gpus",
                          "CPU@local=2"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "bad --store 'localhost'" in out.stderr and "Traceback" not in out.stderr
