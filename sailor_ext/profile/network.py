"""`sailor profile network`: time messages between ranks and fit the simulator's network model.

Every rank is one GPU (one process on CPU) labelled with its node, zone and
GPU type: under torchrun the node is torchrun's node rank (GROUP_RANK) and the
zone is the --zone its node was started with; `--local N` starts N processes
on this machine and takes the labels from --nodes/--zones (on one machine the
links are loopback whatever the labels say: the labels only name them).

What is measured, for message sizes 1 KB .. --max-size (powers of 4):
  * intra-node: a ping-pong between two ranks of one node (one-way time = half
    the round trip);
  * between two nodes of every pair of (zone, GPU type) pools: a ping-pong of 1
    pair, and of n pairs at once where nodes have n ranks (the aggregate
    bandwidth Sailor's inter-node fits describe);
  * an all-reduce between the two ranks of every one-pair link above (its
    `allreduce_efficiency`, which the simulator uses), and, for information,
    over the ranks of one node, over one rank per node and over the world.
Each size is repeated (more often for small messages) and the median kept;
with several pairs at once, the slowest pair's median.

On CPUs, communication right after computing is slower than on idle cores
(on the 2-core VM this was developed on, a 64 KB exchange took 0.2 ms idle and
0.4-1.2 ms right after a burst of matrix multiplications; the cores share
caches and clocks with the compute). Training always communicates right
after computing, so on CPU every timed repetition follows a short burst of
matrix multiplications on every rank (`compute_between_s`).

Rank 0 fits planner.profiles.network_fit's model to the ping-pongs, writes
network.json and, if asked, a PNG of the fits against the measurements.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class NetworkRequest:
    out: str  # network.json to write
    plot: str | None = None  # PNG of fits vs measurements
    min_bytes: int = 1024
    max_bytes: int = 64 * 2**20
    gpu: str | None = None  # GPU type label; default: detected
    zone: str = "local"  # this node's zone (torchrun); local runs read SAILOR_ZONE per rank
    timeout_s: float = 300.0
    # Seconds of matrix multiplications every rank runs before each timed repetition; None: 2 ms on
    # CPU, 0 on GPUs. Training sends right after computing, and on CPUs that matters (see below).
    compute_between_s: float | None = None


@dataclass(frozen=True)
class RankLabel:
    rank: int
    node: int
    zone: str
    gpu: str
    host: str


@dataclass(frozen=True)
class LinkTest:
    kind: str  # intra | inter
    pairs: tuple[tuple[int, int], ...]
    src: RankLabel
    dst: RankLabel

    @property
    def name(self) -> str:
        if self.kind == "intra":
            return f"intra-node {self.src.gpu} (node {self.src.node}, ranks {self.pairs[0][0]}<->{self.pairs[0][1]})"
        return (f"node {self.src.node} ({self.src.zone}, {self.src.gpu}) <-> node {self.dst.node} "
                f"({self.dst.zone}, {self.dst.gpu}), {len(self.pairs)} pair(s)")


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    sizes, x = [], min_bytes
    while x <= max_bytes:
        sizes.append(x)
        x *= 4
    return sizes


def repeats_for(nbytes: int) -> int:
    """Small messages are cheap and noisy: repeat them more."""
    return 30 if nbytes <= 2**20 else 10 if nbytes <= 64 * 2**20 else 4


WARMUP = 2


def plan_links(labels: list[RankLabel]) -> list[LinkTest]:
    """The links worth measuring: one intra-node pair, and every pair of (zone, GPU) pools' nodes."""
    nodes: dict[int, list[RankLabel]] = {}
    for lab in labels:
        nodes.setdefault(lab.node, []).append(lab)
    tests = []
    multi = [n for n in sorted(nodes) if len(nodes[n]) >= 2]
    if multi:
        a, b = nodes[multi[0]][:2]
        tests.append(LinkTest("intra", ((a.rank, b.rank),), a, b))
    pools: dict[tuple[str, str], list[int]] = {}
    for n in sorted(nodes):
        pools.setdefault((nodes[n][0].zone, nodes[n][0].gpu), []).append(n)
    keys = sorted(pools)
    for i, pa in enumerate(keys):
        for pb in keys[i:]:
            if pa == pb:
                if len(pools[pa]) < 2:
                    continue
                na, nb = pools[pa][0], pools[pa][1]
            else:
                na, nb = pools[pa][0], pools[pb][0]
            width = min(len(nodes[na]), len(nodes[nb]))
            for n in sorted({1, width}):
                pairs = tuple((nodes[na][j].rank, nodes[nb][j].rank) for j in range(n))
                tests.append(LinkTest("inter", pairs, nodes[na][0], nodes[nb][0]))
    return tests


class Bench:
    def __init__(self, rank: int, world: int, device: torch.device, max_bytes: int, compute_between_s: float):
        self.rank, self.world, self.device = rank, world, device
        self.buffer = torch.zeros(max(max_bytes // 4, 1), dtype=torch.float32, device=device)
        self.compute_between_s = compute_between_s
        self._matrix = torch.randn(256, 256, device=device) / 16

    def _compute(self) -> None:
        """What training does between two transfers: matrix multiplications, for a while."""
        if self.compute_between_s <= 0:
            return
        x, end = self._matrix, time.perf_counter() + self.compute_between_s
        while time.perf_counter() < end:
            x = torch.tanh(x @ self._matrix)
        self._sync()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _slowest(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def ping_pong(self, pairs: tuple[tuple[int, int], ...], nbytes: int) -> float:
        """One-way seconds of an `nbytes` message, median over repetitions, slowest pair."""
        msg = self.buffer[: max(nbytes // 4, 1)]
        times = []
        for rep in range(WARMUP + repeats_for(nbytes)):
            self._compute()
            dist.barrier()
            for a, b in pairs:
                if self.rank == a:
                    self._sync()
                    t0 = time.perf_counter()
                    dist.send(msg, b)
                    dist.recv(msg, b)
                    self._sync()
                    if rep >= WARMUP:
                        times.append((time.perf_counter() - t0) / 2)
                elif self.rank == b:
                    dist.recv(msg, a)
                    dist.send(msg, a)
        return self._slowest(statistics.median(times) if times else 0.0)

    def allreduce(self, group, ranks: tuple[int, ...], nbytes: int) -> float:
        msg = self.buffer[: max(nbytes // 4, 1)]
        times = []
        for rep in range(WARMUP + repeats_for(nbytes)):
            self._compute()
            dist.barrier()
            if self.rank in ranks:
                self._sync()
                t0 = time.perf_counter()
                dist.all_reduce(msg, group=group)
                self._sync()
                if rep >= WARMUP:
                    times.append(time.perf_counter() - t0)
        return self._slowest(statistics.median(times) if times else 0.0)


def _labels(req: NetworkRequest, rank: int, world: int, device: torch.device) -> list[RankLabel]:
    from sailor_ext.profile.device import resolve_gpu

    node = int(os.environ.get("SAILOR_NODE", os.environ.get("GROUP_RANK", "0")))
    zone = os.environ.get("SAILOR_ZONE", req.zone)
    gpu = resolve_gpu(req.gpu, device.type)
    mine = [rank, node, zone, gpu, os.uname().nodename]
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    return [RankLabel(*x) for x in everyone]


def _allreduce_groups(labels: list[RankLabel]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ranks, slowest link kind) of the all-reduces to time; every rank computes the same list."""
    nodes: dict[int, list[int]] = {}
    for lab in labels:
        nodes.setdefault(lab.node, []).append(lab.rank)
    out = []
    multi = [n for n in sorted(nodes) if len(nodes[n]) >= 2]
    if multi:
        out.append(("intra-node", tuple(nodes[multi[0]]), "intra"))
    if len(nodes) >= 2:
        out.append(("one rank per node", tuple(nodes[n][0] for n in sorted(nodes)), "inter"))
    world = tuple(lab.rank for lab in labels)
    if len(world) > 2 and all(world != ranks for _, ranks, _ in out):
        out.append(("world", world, "inter" if len(nodes) >= 2 else "intra"))
    return out


def _loopback_note(labels: list[RankLabel]) -> str:
    hosts: dict[str, set[int]] = {}
    for lab in labels:
        hosts.setdefault(lab.host, set()).add(lab.node)
    shared = {h: sorted(n) for h, n in hosts.items() if len(n) > 1}
    if not shared:
        return ""
    return "; ".join(f"nodes {', '.join(map(str, n))} ran on one host ({h}): the links between them are loopback, "
                     "their node and zone labels only name them" for h, n in shared.items())


def run(req: NetworkRequest, say=print) -> dict | None:
    """Measure, fit, write (rank 0); returns the network document on rank 0, None elsewhere."""
    from planner.profiles.network_fit import (AllReduceMeasurement, LinkMeasurement, allreduce_entry, fit_link,
                                              network_document, plot_network, with_allreduce, write_network)
    from sailor_ext.compat import pick_device
    from sailor_ext.profile.device import software_versions, today

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = pick_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=req.timeout_s))
    if world < 2:
        raise SystemExit("sailor profile network needs at least 2 ranks (--local 2, or torchrun with 2 processes)")
    labels = _labels(req, rank, world, device)
    sizes = message_sizes(req.min_bytes, req.max_bytes)
    between = req.compute_between_s if req.compute_between_s is not None else (0.002 if device.type == "cpu" else 0.0)
    bench = Bench(rank, world, device, sizes[-1], between)
    tests = plan_links(labels)
    # every rank creates every group, in one order, before any is used
    pair_groups = {i: dist.new_group(list(t.pairs[0])) for i, t in enumerate(tests) if len(t.pairs) == 1}
    paired = {tuple(sorted(t.pairs[0])) for t in tests if len(t.pairs) == 1}
    info_groups = [(name, ranks, kind, dist.new_group(list(ranks))) for name, ranks, kind in _allreduce_groups(labels)
                   if tuple(sorted(ranks)) not in paired]
    links: list[LinkMeasurement] = []
    pair_reductions: dict[int, AllReduceMeasurement] = {}
    for i, test in enumerate(tests):
        if rank == 0:
            say(f"p2p {test.name}: {len(sizes)} sizes, {sizes[0] // 1024} KB .. {sizes[-1] / 2**20:g} MB", flush=True)
        seconds = [bench.ping_pong(test.pairs, x) for x in sizes]
        links.append(LinkMeasurement(test.kind, test.src.zone, test.src.gpu, test.dst.zone, test.dst.gpu,
                                     len(test.pairs), tuple(sizes), tuple(seconds)))
        if i in pair_groups:
            seconds = [bench.allreduce(pair_groups[i], test.pairs[0], x) for x in sizes]
            pair_reductions[i] = AllReduceMeasurement(f"pair {test.pairs[0][0]}-{test.pairs[0][1]}", test.pairs[0],
                                                      test.kind, tuple(sizes), tuple(seconds))
    reductions = []
    for name, ranks, kind, group in info_groups:
        if rank == 0:
            say(f"all-reduce over {name} (ranks {', '.join(map(str, ranks))})", flush=True)
        seconds = [bench.allreduce(group, ranks, x) for x in sizes]
        reductions.append(AllReduceMeasurement(name, ranks, kind, tuple(sizes), tuple(seconds)))
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    fits = [fit_link(m) for m in links]
    # each link's all-reduce efficiency; links of several pairs take their one-pair sibling's
    for i, f in enumerate(fits):
        if i in pair_reductions:
            fits[i] = with_allreduce(f, pair_reductions[i])
    for i, f in enumerate(fits):
        if f.allreduce_efficiency is None:
            sibling = next((g for g in fits if g.link.gpus == 1 and g.allreduce_efficiency is not None and
                            (g.link.kind, g.link.src_zone, g.link.src_gpu, g.link.dst_zone, g.link.dst_gpu) ==
                            (f.link.kind, f.link.src_zone, f.link.src_gpu, f.link.dst_zone, f.link.dst_gpu)), None)
            if sibling is not None:
                fits[i] = replace(f, allreduce_efficiency=sibling.allreduce_efficiency)
    by_kind = {}
    for f in fits:
        if f.link.gpus == 1:
            by_kind.setdefault(f.link.kind, f)
    entries = [allreduce_entry(m, fits[i]) for i, m in pair_reductions.items()]
    entries += [allreduce_entry(m, by_kind.get(m.link)) for m in reductions]
    meta = {"created": today(), "software": software_versions(), "device": device.type,
            "ranks": [lab.__dict__ for lab in labels], "notes": _loopback_note(labels)}
    meta["method"] = {"statistic": "median over repetitions; with several pairs, the slowest pair's",
                      "compute_between_s": between, "repeats": {str(x): repeats_for(x) for x in sizes}}
    doc = network_document(fits, entries, meta)
    write_network(doc, req.out)
    if req.plot:
        plot_network(fits, req.plot, title=f"sailor profile network ({world} ranks, {device.type})")
    return doc


def main(argv: list[str] | None = None) -> int:
    """`python -m sailor_ext.profile.network CONFIG.json`: one rank of a local run."""
    argv = sys.argv[1:] if argv is None else argv
    req = NetworkRequest(**json.loads(Path(argv[0]).read_text()))
    doc = run(req)
    if doc is not None:
        print(json.dumps({"written": req.out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
