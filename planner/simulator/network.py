"""Time of point-to-point transfers and ring all-reduces over mixed links.

An endpoint is one replica's side of a transfer: its GPU type, zone, node, and
how many of its GPUs move data in parallel. Between two endpoints the link is

  * intra-node  (same node): NVLink/PCIe, per-GPU bandwidth x GPUs taking part;
  * inter-node  (same zone), inter-zone (same region), inter-region (WAN).

Bandwidth comes from a measured fit where one exists (Sailor's providers/ or
`sailor profile network`, keyed by zone, GPU type and GPU count on each side),
else from the catalog: the node NIC shared in proportion to the GPUs taking
part, capped for WAN links. Sailor's measured fits already contain latency
effects; default links add a per-message latency, and fits from `sailor profile
network` carry their own measured latency.

    p2p(x)        = latency + x / BW(x)                                      [s]
    allreduce(G)  = max over ring edges e of 2(D-1)/D * G / (BW_e * AR_EFF_e)
                    + 2(D-1) * latency                                        [s]

G is the gradient bytes of one replica (all its TP shards), D the replicas in
the ring; the ring visits replicas in plan order, and every edge carries
2(D-1)/D * G bytes, split over the GPUs of the smaller side. A replica of t
GPUs runs t rings at once (one per TP rank, each over its G/t shard), and they
share the node's links: the fit for t GPUs per side is the aggregate of t
concurrent transfers (Sailor's convention), so the t rings together take
2(D-1)/D * G / BW_e(t GPUs).

AR_EFF_e: a ring sends and receives at once, one neighbour each way, and the
links are full duplex, so every edge streams its 2(D-1)/D * G at the one-way
bandwidth BW_e that the p2p fits measure: AR_EFF_e = 1 (RING_EFFICIENCY). A fit
from `sailor profile network` carries the efficiency its all-reduces reached
(`allreduce_efficiency`), which then replaces 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.profiles.network_fits import NetworkFits
from planner.specs.hardware import Cluster

# Share of the measured one-way bandwidth a ring all-reduce streams at, where no
# all-reduce was measured over the link: 1, since each NIC sends to one
# neighbour and receives from the other at once over full-duplex links (the
# bound of a bandwidth-optimal ring). The mixed-RTX run with data parallelism
# (1 Gbit/s Ethernet) reaches it; Clariden's GH200 rings reach about half of it
# (docs/simulator.md, "Gradient synchronisation").
RING_EFFICIENCY = 1.0
BUCKET_BYTES = 5e8  # gradients are reduced in buckets of this size (DeepSpeed's default)

LATENCY_S = {"intra": 5e-6, "zone": 2e-5, "region": 2e-4, "continent": 2e-2, "world": 7e-2}
WAN_GBPS = {"continent": 1.0, "world": 0.3}  # node-to-node WAN throughput without a measured fit


@dataclass(frozen=True)
class Endpoint:
    """One end of a link: a replica's GPUs on a node of a zone."""

    gpu: str
    zone: str
    node: int
    gpus: int  # GPUs of this replica that move data in parallel


class Network:
    def __init__(self, cluster: Cluster, fits: NetworkFits):
        self.cluster = cluster
        self.fits = fits
        self._cache: dict = {}
        self._measured: dict | None = None
        self._links: dict = {}  # (a, b) fields -> (link class, its fit or None)

    def link_class(self, a: Endpoint, b: Endpoint) -> str:
        if a.node == b.node:
            return "intra"
        if a.zone == b.zone:
            return "zone"
        za, zb = self.cluster.zone(a.zone), self.cluster.zone(b.zone)
        if za.region == zb.region:
            return "region"
        return "continent" if za.region.split("-")[0] == zb.region.split("-")[0] else "world"

    def _link(self, a: Endpoint, b: Endpoint) -> tuple:
        """(link class, fit or None, all-reduce efficiency, latency, bytes/s of an unmeasured link or None)
        of a link; cached, the planner asks for the same links again and again."""
        key = (a.gpu, a.zone, a.node, a.gpus, b.gpu, b.zone, b.node, b.gpus)
        got = self._links.get(key)
        if got is None:
            kind = self.link_class(a, b)
            fit = self.fits.intra_fit(a.gpu, 2) if kind == "intra" else self._inter_fit(a, b)
            # measured by `sailor profile network` where the fit carries them
            eff = fit.allreduce_efficiency if fit is not None and fit.allreduce_efficiency is not None \
                else RING_EFFICIENCY
            if fit is not None and fit.latency_s is not None:
                lat = fit.latency_s
            else:
                lat = 0.0 if kind != "intra" and fit is not None else LATENCY_S[kind]  # 0: measured end to end
            got = self._links[key] = (kind, fit, eff, lat, None if fit is not None else self._catalog(kind, a, b))
        return got

    def _catalog(self, kind: str, a: Endpoint, b: Endpoint) -> float:
        """Bytes/s of a link without a measured fit, from the GPU catalog (any message size)."""
        if kind == "intra":
            return self.cluster.gpu(a.gpu).intra_node_gbps * 1e9 * min(a.gpus, b.gpus)
        ga, gb = self.cluster.gpu(a.gpu), self.cluster.gpu(b.gpu)
        share = min(ga.node_nic_gbps * a.gpus / ga.gpus_per_node, gb.node_nic_gbps * b.gpus / gb.gpus_per_node)
        if kind in WAN_GBPS:
            share = min(share, WAN_GBPS[kind])
        return share * 1e9

    def bytes_per_s(self, nbytes: float, a: Endpoint, b: Endpoint, link: tuple | None = None) -> float:
        """Bandwidth for moving `nbytes` in total, split evenly over the GPUs taking part (link: _link's)."""
        kind, fit, _, _, flat = link or self._link(a, b)
        if flat is not None:
            return flat
        n = min(a.gpus, b.gpus)
        per_gpu = fit.bytes_per_s(nbytes / n)  # fits are indexed by the message each GPU sends
        return per_gpu * n if kind == "intra" else per_gpu

    def peak_ring_rate(self, a: Endpoint, b: Endpoint) -> tuple[float, float]:
        """(bytes/s, latency s) such that no message size lets a ring edge a -> b stream faster
        than that rate: what allreduce_time divides by, at its largest (bounds for the planner)."""
        kind, fit, eff, lat, flat = self._link(a, b)
        rate = flat if flat is not None else fit.peak_bytes_per_s * (min(a.gpus, b.gpus) if kind == "intra" else 1)
        return rate * eff, lat

    def _inter_fit(self, a: Endpoint, b: Endpoint):
        key = (a.gpu, a.zone, a.gpus, b.gpu, b.zone, b.gpus)
        if key not in self._cache:
            fit = self.fits.inter_fit(a.zone, a.gpu, a.gpus, b.zone, b.gpu, b.gpus)
            if fit is None and (a.gpus > 1 or b.gpus > 1):
                # GPU counts beyond the measured ones (e.g. 8 on a 4-GPU fit): the largest measured.
                if self._measured is None:  # (zone, zone) -> (GPU, count) of the fits with equal counts
                    self._measured = {}
                    for k in self.fits.inter:
                        if k[2] == k[5]:
                            self._measured.setdefault((k[0], k[3]), []).append((k[1], k[2]))
                counts = {n for g, n in self._measured.get((a.zone, b.zone), ()) if g in (a.gpu, b.gpu)}
                counts = [n for n in counts if self.fits.inter_fit(a.zone, a.gpu, n, b.zone, b.gpu, n) is not None]
                if counts:
                    n = max(c for c in counts if c <= max(a.gpus, b.gpus)) if min(counts) <= max(a.gpus, b.gpus) \
                        else min(counts)
                    fit = self.fits.inter_fit(a.zone, a.gpu, n, b.zone, b.gpu, n)
            self._cache[key] = fit
        return self._cache[key]

    def allreduce_efficiency(self, a: Endpoint, b: Endpoint) -> float:
        """Share of the link's one-way bandwidth a ring all-reduce reaches over it: measured by
        `sailor profile network` where the fit carries it, else RING_EFFICIENCY (full duplex)."""
        return self._link(a, b)[2]

    def latency(self, a: Endpoint, b: Endpoint) -> float:
        return self._link(a, b)[3]

    def p2p_time(self, nbytes: float, a: Endpoint, b: Endpoint) -> float:
        """Seconds to move `nbytes` from a to b, spread over their GPUs."""
        if nbytes <= 0:
            return 0.0
        return self.latency(a, b) + nbytes / self.bytes_per_s(nbytes, a, b)

    def allreduce_time(self, nbytes: float, members: int, edges: list[tuple[Endpoint, Endpoint, int]]) -> float:
        """Ring all-reduce of `nbytes` (per member, all its GPUs) over a ring of `members`
        replicas whose distinct edges are `edges` (see ring_edges)."""
        D = members
        if D < 2 or nbytes <= 0:
            return 0.0
        volume = 2 * (D - 1) / D * nbytes
        worst, lat = 0.0, 0.0
        for a, b, _ in edges:  # (the planner's inner loop: min and max written out)
            n = a.gpus if a.gpus <= b.gpus else b.gpus
            bucket = BUCKET_BYTES * n
            step = (nbytes if nbytes <= bucket else bucket) / D  # what the edge moves in one ring step
            link = self._link(a, b)
            t = volume / (self.bytes_per_s(step, a, b, link) * link[2])
            if t > worst:
                worst = t
            if link[3] > lat:
                lat = link[3]
        return worst + 2 * (D - 1) * lat


def ring_edges(replicas, nodes: list[int]) -> list[tuple[Endpoint, Endpoint, int]]:
    """The distinct edges of a stage's gradient ring (replica k -> k+1, last -> first; replica k, a
    TP group of its GPUs, on node nodes[k]) and how often each occurs.

    Rings of many identical replicas repeat a few edges; only whether the two
    ends share a node matters, so edges are normalised to nodes 0/0 or 0/1.
    """
    D = len(replicas)
    counts: dict[tuple, int] = {}
    for k, a in enumerate(replicas):
        b = replicas[(k + 1) % D]
        key = (a.gpu, a.zone, a.tp, b.gpu, b.zone, b.tp, nodes[k] == nodes[(k + 1) % D])
        counts[key] = counts.get(key, 0) + 1
    return [(Endpoint(ag, az, 0, an), Endpoint(bg, bz, 0 if same else 1, bn), n)
            for (ag, az, an, bg, bz, bn, same), n in counts.items()]
