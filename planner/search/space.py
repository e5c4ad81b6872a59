"""The planner's search space: its designs, and the rules that place them.

A plan is built from
  * a microbatch size b shared by all pipelines (b divides the global batch; its
    M = gbs/b microbatches are spread over the pipelines as evenly as possible
    within each GPU type);
  * P stages and any contiguous split of the layers into them;
  * a design, one of three kinds (one module each):
      single_pool.py  every stage on one GPU type with one TP degree; pipelines fill
                      the type's zones (cheapest, then fastest network, then largest);
      chains.py       a pipeline through a chain of pools (GPU type x zone): the first
                      stages on one pool, the next on another, ...; each pool with its
                      own TP degree (pairs of any pools, and one type over 3+ zones);
      two_types.py    pipelines of two GPU types side by side, each type with its own
                      TP degree and microbatch count (throughput objective and Pareto fronts);
  * the number of pipelines D;
  * node placement by the simulator's rule (simulator/placement.py);
  * after the search, the best plans' replicas also tried stage by stage over
    their zones: several chains side by side (arrange.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.search.partition import StageCosts
from planner.simulator.network import Endpoint
from planner.specs.plan import Pipeline, Plan, Replica, Stage

@dataclass(frozen=True)
class Segment:
    """Consecutive stages that run on one GPU type with one TP degree."""

    gpu: str
    tp: int
    stages: int
    zones: tuple[str, ...]  # the segment's zone in each pipeline


@dataclass(frozen=True)
class Design:
    """Everything needed to write down one candidate plan."""

    mbs: int
    segments: tuple[Segment, ...]
    bounds: tuple[int, ...]  # first layer of stages 1..P-1
    microbatches: tuple[int, ...]  # per pipeline

    def to_plan(self, model: str, num_layers: int, gbs: int, runtime: str) -> Plan:
        firsts = (0, *self.bounds)
        lasts = (*(b - 1 for b in self.bounds), num_layers - 1)
        kinds = [seg for seg in self.segments for _ in range(seg.stages)]
        stages = tuple(Stage(f, last, tuple(Replica(seg.gpu, seg.tp, z) for z in seg.zones))
                       for f, last, seg in zip(firsts, lasts, kinds))
        return Plan(model, gbs, stages, tuple(Pipeline(self.mbs, m) for m in self.microbatches), runtime)


@dataclass(frozen=True)
class ClassDesign:
    """Pipelines of two classes (GPU type, TP) side by side, sharing the stages' layers."""

    mbs: int
    classes: tuple  # per class: (gpu, tp, zone of each pipeline, microbatches of each pipeline)
    bounds: tuple[int, ...]

    def to_plan(self, model: str, num_layers: int, gbs: int, runtime: str) -> Plan:
        firsts = (0, *self.bounds)
        lasts = (*(b - 1 for b in self.bounds), num_layers - 1)
        replicas = tuple(Replica(g, tp, z) for g, tp, zones, _ in self.classes for z in zones)
        pipelines = tuple(Pipeline(self.mbs, m) for _, _, _, micro in self.classes for m in micro)
        return Plan(model, gbs, tuple(Stage(f, last, replicas) for f, last in zip(firsts, lasts)), pipelines, runtime)


@dataclass
class Shape:
    """One GPU type, microbatch size and TP degree: what every stage of a design runs on."""

    gpu: str
    mbs: int
    tp: int
    per_node: int
    zones: list[tuple[str, int]]  # (zone, usable GPUs), in fill order
    costs: StageCosts
    comm: dict  # (zone, same node) -> seconds per boundary
    u: float  # optimizer seconds per logical parameter on one GPU
    prices: dict  # zone -> USD per GPU-second
    plain: StageCosts | None = None  # a recomputing shape's costs without recomputation (auto mode)
    tables: dict = field(default_factory=dict)


# Chains put up to this many stages on a pool that another follows: before another GPU type
# (cheap or memory-light GPUs for the first stages), or before the same type in another zone.
FIRST_POOL_STAGES = {"other type": 4, "other zone": 2}


def spread(total: int, parts: int) -> tuple[int, ...]:
    """`total` microbatches over `parts` pipelines, as evenly as possible (largest first)."""
    q, r = divmod(total, parts)
    return tuple(q + 1 if k < r else q for k in range(parts))


def crossing(lo: int, hi: int, times) -> tuple[float, int] | None:
    """min over mx in [lo, hi] of max(times(mx)), where times(mx) = (rising, falling) or None
    beyond some mx (the falling side ran out); the optimum is where the two cross."""
    while hi >= lo and times(hi) is None:
        hi -= 1
    if hi < lo:
        return None
    a, b = lo, hi
    while a < b:
        mid = (a + b) // 2
        rise, fall = times(mid)
        if rise >= fall:
            b = mid
        else:
            a = mid + 1
    return min((max(times(mx)), mx) for mx in (a - 1, a) if lo <= mx <= hi)


def capacity(count: int, per_node: int, stages: int, tp: int) -> int:
    """Pipelines of `stages` x `tp` GPUs that `count` GPUs of a zone hold under the placement rule."""
    need = stages * tp
    if need <= per_node:  # whole pipelines per node
        return (count // per_node) * (per_node // need) + (count % per_node) // need
    return (count // per_node // stages) * (per_node // tp)  # stage by stage, whole nodes


def ring_edge_counts(placed: list[tuple[str, int]], per_node_replicas: int) -> dict:
    """(zone, zone, same node) -> how often that edge occurs in a stage's gradient ring of the replicas
    `placed` as [(zone, count)] in ring order, per_node_replicas to a node (as network.ring_edges of the
    placed plan)."""
    counts: dict = {}

    def add(za, zb, same, n=1):
        if n > 0:
            key = (za, zb, same)
            counts[key] = counts.get(key, 0) + n

    q = per_node_replicas
    for i, (z, k) in enumerate(placed):
        nodes = math.ceil(k / q)
        add(z, z, True, k - nodes)  # neighbours on one node
        add(z, z, False, nodes - 1)  # the next node of the zone
        if i + 1 < len(placed):
            add(z, placed[i + 1][0], False)
    z0, zl = placed[0][0], placed[-1][0]
    if len(placed) > 1:
        add(zl, z0, False)  # back to the first zone
    else:
        add(z0, z0, math.ceil(placed[0][1] / q) == 1)
    return counts


def ring_edges_of(gpu: str, tp: int, placed: list[tuple[str, int]], per_node_replicas: int):
    """Distinct edges of a stage's gradient ring (as network.ring_edges of the placed plan)."""
    return [(*edge_ends(gpu, tp, *kind), n) for kind, n in ring_edge_counts(placed, per_node_replicas).items()]


def edge_ends(gpu: str, tp: int, za: str, zb: str, same: bool) -> tuple[Endpoint, Endpoint]:
    """The two ends of a ring edge (za, zb, same node), in network.ring_edges' form (nodes 0/0 or 0/1)."""
    return _endpoint(gpu, za, 0, tp), _endpoint(gpu, zb, 0 if same else 1, tp)


_ENDPOINTS: dict = {}  # (gpu, zone, node, gpus) -> Endpoint: immutable, so shared (few distinct ones)


def _endpoint(gpu: str, zone: str, node: int, gpus: int) -> Endpoint:
    key = (gpu, zone, node, gpus)
    end = _ENDPOINTS.get(key)
    if end is None:
        end = _ENDPOINTS[key] = Endpoint(gpu, zone, node, gpus)
    return end


def zone_classes(cluster, fits, zones, gpu: str | None = None) -> list[list[str]]:
    """`zones` (in their order) in classes of interchangeable ones, for GPUs of type `gpu` (None: every
    type): one region, the same GPUs offered at the same prices, no quota, the same egress and the same
    measured links (fits: NetworkFits.inter) to every zone. Swapping two zones of a class everywhere in
    a design changes nothing the simulator or a plan's promises read, so each swap inside a class is a
    symmetry of the search (chains.py) and of the arrangements (arrange.py)."""
    zones = list(zones)
    have = {z: sorted((p.gpu, p.count, p.spot, cluster.price_per_hour(p.gpu, z, cluster.is_spot(p.gpu, z)))
                      for p in cluster.available if p.zone == z and gpu in (None, p.gpu)) for z in zones}
    fits = {k: f for k, f in fits.items() if gpu is None or k[1] == k[4] == gpu}

    def alike(a: str, b: str) -> bool:
        if cluster.zone(a).region != cluster.zone(b).region or have[a] != have[b] or a in cluster.quotas \
                or b in cluster.quotas:
            return False
        swap = {a: b, b: a}
        if any(cluster.egress_per_gb(a, z) != cluster.egress_per_gb(b, swap.get(z, z)) or
               cluster.egress_per_gb(z, a) != cluster.egress_per_gb(swap.get(z, z), b) for z in zones):
            return False
        return all(fits.get((swap.get(k[0], k[0]), *k[1:3], swap.get(k[3], k[3]), *k[4:])) == f
                   for k, f in fits.items() if a in (k[0], k[3]) or b in (k[0], k[3]))

    classes: list[list[str]] = []
    for z in zones:  # every two of a class alike: each swap inside it is a symmetry, so any permutation is
        home = next((c for c in classes if all(alike(y, z) for y in c)), None)
        if home is None:
            classes.append([z])
        else:
            home.append(z)
    return classes
