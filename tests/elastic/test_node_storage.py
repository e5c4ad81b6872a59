"""Checkpoints on the nodes' own disks (node:NAME): the file servers the agents run
(planner/elastic/files.py) and the storage that writes every file to its node and one other
(sailor_ext/storage.py, NodeStorage). In-process; the elastic job that loses a node is in
test_checkpoint_storage.py."""
from __future__ import annotations

import shutil

import pytest

from planner.elastic.files import FileClient, FileServer
from planner.errors import SailorError
from sailor_ext import storage


@pytest.fixture
def nodes(tmp_path):
    """Three nodes' disks, each served; this process plays node a (buddy: b)."""
    disks = {n: tmp_path / f"disk-{n}" for n in "abc"}
    servers = {n: FileServer(str(d), host="127.0.0.1") for n, d in disks.items()}
    url = {n: f"http://127.0.0.1:{s.port}" for n, s in servers.items()}
    storage.configure_nodes(str(disks["a"]), [(url[n], servers[n].token) for n in "bc"], 0)
    yield disks, servers, url
    storage._NODES.clear()
    for s in servers.values():
        s.close()


def test_a_file_lands_on_its_node_and_its_buddy_and_reads_survive_either_loss(nodes):
    disks, servers, _ = nodes
    s = storage.open_storage("node:ckpt")
    data = bytes(range(256)) * 40
    s.put("iter_0000004/rank00000-ab.bin", data)
    s.put("latest", b"iter_0000004 x\n")
    for n, has in (("a", True), ("b", True), ("c", False)):  # its node and the next one, not the third
        assert (disks[n] / "ckpt" / "iter_0000004" / "rank00000-ab.bin").exists() == has, n
    assert (disks["b"] / "ckpt" / "iter_0000004" / "rank00000-ab.bin").read_bytes() == data
    (disks["c"] / "ckpt" / "iter_0000008").mkdir(parents=True)  # something only node c holds
    (disks["c"] / "ckpt" / "iter_0000008" / "meta.json").write_bytes(b"{}")
    assert s.children() == ["iter_0000004", "iter_0000008", "latest"]  # the union of the nodes
    assert s.get("iter_0000008/meta.json") == b"{}" and s.exists("iter_0000008/meta.json")
    shutil.rmtree(disks["a"] / "ckpt")  # this node's disk lost: the copy answers, ranges too
    assert s.get("iter_0000004/rank00000-ab.bin", 1000, 1010) == data[1000:1010]
    assert s.size("iter_0000004/rank00000-ab.bin") == len(data)
    buf = bytearray(100)
    assert s.read_into("iter_0000004/rank00000-ab.bin", 5, memoryview(buf)) == 100 and bytes(buf) == data[5:105]
    servers["c"].close()  # a node that no longer answers holds nothing, and is no error for a read
    assert s.children() == ["iter_0000004", "latest"] and not s.exists("iter_0000008/meta.json")
    with pytest.raises(FileNotFoundError):
        s.get("iter_0000008/meta.json")
    s.remove("iter_0000004")
    assert not (disks["b"] / "ckpt" / "iter_0000004").exists() and s.children() == ["latest"]


def test_a_write_whose_copy_fails_fails(nodes):
    _, servers, _ = nodes
    servers["b"].close()
    with pytest.raises(OSError, match="its copy on another node failed"):
        storage.open_storage("node:ckpt").put("latest", b"x")


def test_the_server_refuses_a_wrong_token_and_paths_outside_its_root(nodes):
    disks, servers, url = nodes
    (disks["b"] / "secret").write_bytes(b"s")
    with pytest.raises(OSError, match="403"):
        FileClient(url["b"], "not-the-token").get("secret")
    good = FileClient(url["b"], servers["b"].token)
    assert good.get("secret") == b"s"
    with pytest.raises(OSError, match="400"):
        good.get("../disk-a/anything")


def test_node_storage_outside_an_elastic_job_is_one_line():
    storage._NODES.clear()
    with pytest.raises(SailorError, match="agents were started with --node-dir"):
        storage.open_storage("node:ckpt")
    storage.configure_nodes("/tmp", [], None)
    try:
        with pytest.raises(SailorError, match="give node:NAME"):
            storage.open_storage("node:../x")
    finally:
        storage._NODES.clear()
