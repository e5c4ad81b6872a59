"""What the baseline planners share: the GPUs they are handed, layer splits,
the terms of their cost models, and turning a choice into a Plan.

The baselines re-create the planning *policies* of published systems over our
search space and our profiles, so that our simulator can judge every plan the
same way. Each baseline has its own cost model to choose with (as the
original has); the terms they have in common live here:

  * per-layer compute, parameters and activations come from the same
    profiles our simulator reads (every original profiles the model too);
  * p2p and all-reduce estimates use the measured network fits at the raw
    link bandwidth, assuming every link leaves the node: the originals model
    a bandwidth per link, not NCCL's ring efficiency nor our node placement;
  * memory is estimated in one of three ways (`MemoryView`), the way the
    original counts it; none of them except EXACT knows the framework's
    non-tensor memory (CUDA context, communication buffers, allocator
    fragmentation), which is why such planners can pick plans that run out of
    memory on a real run, and under our simulator.

Zone-unaware baselines see a flat network: they estimate every link as a link
inside the zone of the first GPU they were given.

The GPUs a baseline is handed are `devices(cluster)`: every GPU of every pool
in the order the pools are listed (zone quotas applied), as a launcher's
host list would enumerate them. Baselines that map ranks to GPUs do it
Megatron's way (tensor-parallel ranks fastest, then data-parallel, then
pipeline stages), see `rank_order`.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum

from planner.errors import SailorError
from planner.search.space import spread
from planner.simulator.network import Endpoint
from planner.simulator.placement import place
from planner.simulator.runtime_model import runtime_model
from planner.simulator.simulate import GRAD_BYTES, Simulator
from planner.specs.hardware import Cluster
from planner.specs.plan import Pipeline, Plan, Replica, Stage, with_model

INF = math.inf
Device = tuple[str, str]  # (GPU type, zone) of one GPU


@dataclass
class BaselineResult:
    """A baseline's pick and what its own cost model predicted for it."""

    name: str
    plan: Plan
    predicted_iteration_time_s: float  # the baseline's estimate, not our simulator's
    search_time_s: float
    candidates: int  # configurations its cost model looked at
    notes: dict = field(default_factory=dict)


class MemoryView(Enum):
    """How a baseline's cost model counts the memory of one GPU.

    EXACT      our simulator's formula (a grid search that really runs each configuration sees this)
    TENSORS    weights, gradients and optimizer state, plus the activations of the microbatches in
               flight; no runtime overhead, no allocator slack, no backward workspace
    RECOMPUTE  TENSORS for a runtime with activation recomputation: only each in-flight
               microbatch's stage input is kept, plus one microbatch's activations while it is
               recomputed (Varuna always recomputes)
    NONE       memory is not modelled at all
    """

    EXACT = "exact"
    TENSORS = "tensors"
    RECOMPUTE = "recompute"
    NONE = "none"


def check_inputs(name: str, sim: Simulator, global_batch: int) -> None:
    if global_batch < 1:
        raise SailorError(f"{name}: the global batch must be positive (got {global_batch})")
    if not any(p.count > 0 for p in sim.cluster.available):
        raise SailorError(f"{name}: no GPUs given; list the GPUs it may use (e.g. --gpus A100-40@us-central1-a=32)")


def devices(cluster: Cluster) -> list[Device]:
    """Every GPU handed over, pool by pool in the order given; a zone's quota takes the first ones."""
    left = dict(cluster.quotas)
    out: list[Device] = []
    for pool in cluster.available:
        n = pool.count
        if pool.zone in left:
            n = min(n, left[pool.zone])
            left[pool.zone] -= n
        out += [(cluster.gpu(pool.gpu).name, pool.zone)] * max(n, 0)
    return out


def by_type(devs: list[Device]) -> dict[str, list[Device]]:
    """The devices of each GPU type, in the order given (types in order of first appearance)."""
    out: dict[str, list[Device]] = {}
    for d in devs:
        out.setdefault(d[0], []).append(d)
    return out


def timed(fn):
    """Run a baseline's search, stamping its CPU time on the result."""

    def run(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
        t0 = time.process_time()
        result = fn(sim, global_batch, runtime)
        result.search_time_s = time.process_time() - t0
        return result

    run.__doc__, run.__name__, run.__wrapped__ = fn.__doc__, fn.__name__, fn
    return run


# -- per-layer facts ----------------------------------------------------------
class Costs:
    """Prefix sums over the layers of one GPU type at one (microbatch size, TP degree)."""

    def __init__(self, sim: Simulator, gpu: str, mbs: int, tp: int, state_bytes: float):
        prof = sim.profile(gpu)
        times, mem, logical = prof.layer_times(mbs, tp), prof.layer_memory(tp), prof.layer_memory(1)
        self.gpu, self.mbs, self.tp = gpu, mbs, tp
        self.capacity = sim.cluster.gpu(gpu).memory_bytes
        self.state_bytes = state_bytes
        self._fwd = _prefix(times.fwd)
        self._fb = _prefix([f + b for f, b in zip(times.fwd, times.bwd)])
        self._params = _prefix(mem.params)  # on one GPU of the TP group
        self._grads = _prefix(logical.params)  # of the whole replica: what its all-reduce moves
        self._acts = _prefix(mem.activation_bytes)
        self.output_bytes = logical.output_bytes  # per sample

    def fb(self, first: int, last: int) -> float:
        """Forward + backward seconds of layers first..last for one microbatch."""
        return self._fb[last + 1] - self._fb[first]

    def fwd(self, first: int, last: int) -> float:
        return self._fwd[last + 1] - self._fwd[first]

    def grad_params(self, first: int, last: int) -> int:
        return self._grads[last + 1] - self._grads[first]

    def memory(self, view: MemoryView, first: int, last: int, inflight: int) -> float:
        """Bytes on one GPU of a replica holding layers first..last, as `view` counts them."""
        if view is MemoryView.NONE:
            return 0.0
        params = self._params[last + 1] - self._params[first]
        acts = self._acts[last + 1] - self._acts[first]
        state = self.state_bytes * params
        if view is MemoryView.TENSORS:
            return state + self.mbs * inflight * acts
        if view is MemoryView.RECOMPUTE:
            stage_input = self.output_bytes[first - 1] if first > 0 else 0.0
            return state + self.mbs * (inflight * stage_input + acts)
        raise ValueError(f"{view} is our simulator's own formula: simulate the plan instead")

    def fits(self, view: MemoryView, first: int, last: int, inflight: int) -> bool:
        return view is MemoryView.NONE or self.memory(view, first, last, inflight) <= self.capacity


def _prefix(values) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


class Toolkit:
    """Cached cost-model terms for one simulator (the baselines' shared view of profiles and network)."""

    def __init__(self, sim: Simulator, runtime: str = "sailor", flat_zone: str | None = None):
        """flat_zone: a zone-unaware cost model sees every link as a link inside this zone."""
        self.sim = sim
        self.rt = runtime_model(runtime)
        self.state_bytes = self.rt.state_bytes(sim.precision)
        self.flat_zone = flat_zone
        self.L = sim.model.num_layers
        self._costs: dict = {}
        self._p2p: dict = {}
        self._bw: dict = {}

    def configs(self, gpu: str) -> list[tuple[int, int]]:
        """(microbatch size, TP degree) pairs the profile of `gpu` has, with TP inside a node."""
        prof = self.sim.profile(gpu)
        per_node = self.sim.cluster.gpu(gpu).gpus_per_node
        return sorted((b, t) for b, t in prof.times if t <= per_node and t in prof.memory)

    def has(self, gpu: str, mbs: int, tp: int) -> bool:
        prof = self.sim.profile(gpu)
        return (mbs, tp) in prof.times and tp in prof.memory and tp <= self.sim.cluster.gpu(gpu).gpus_per_node

    def costs(self, gpu: str, mbs: int, tp: int) -> Costs:
        key = (gpu, mbs, tp)
        if key not in self._costs:
            self._costs[key] = Costs(self.sim, gpu, mbs, tp, self.state_bytes)
        return self._costs[key]

    def _zone(self, zone: str) -> str:
        return self.flat_zone or zone

    def p2p(self, mbs: int, a: Replica, b: Replica) -> float:
        """Seconds to send one microbatch's activation from replica a to replica b (on another node)."""
        za, zb = self._zone(a.zone), self._zone(b.zone)
        key = (mbs, a.gpu, a.tp, za, b.gpu, b.tp, zb)
        if key not in self._p2p:
            x = mbs * self.costs(a.gpu, mbs, a.tp).output_bytes[1]
            la, lb = (a.tp, b.tp) if self.rt.p2p_split_over_tp else (1, 1)
            self._p2p[key] = self.sim.network.p2p_time(x, Endpoint(a.gpu, za, 0, la), Endpoint(b.gpu, zb, 1, lb))
        return self._p2p[key]

    def allreduce(self, grad_params: int, ring: list[Replica]) -> float:
        """Ring all-reduce of a stage's fp32 gradients over its replicas, at the slowest link's bandwidth."""
        D = len(ring)
        if D < 2 or grad_params <= 0:
            return 0.0
        nbytes = GRAD_BYTES * grad_params
        links = {(a.gpu, a.tp, self._zone(a.zone), b.gpu, b.tp, self._zone(b.zone))
                 for a, b in zip(ring, ring[1:] + ring[:1])}
        bw = min(self._link_bw(nbytes / D, link) for link in links)
        return 2 * (D - 1) / D * nbytes / bw

    def _link_bw(self, chunk: float, link) -> float:
        key = (round(chunk), link)
        if key not in self._bw:
            ga, ta, za, gb, tb, zb = link
            self._bw[key] = self.sim.network.bytes_per_s(chunk, Endpoint(ga, za, 0, ta), Endpoint(gb, zb, 1, tb))
        return self._bw[key]


# -- layer splits -------------------------------------------------------------
def block_bounds(num_blocks: int, stages: int, strict: bool = False) -> tuple[int, ...] | None:
    """First layer of stages 1..P-1 when the transformer blocks are split as evenly as possible.

    The embedding rides with the first stage, the head (and a separate final
    norm) with the last, as Megatron and Varuna place them. `strict`: the
    blocks must divide evenly (Megatron's requirement).
    """
    if stages < 1 or stages > num_blocks or (strict and num_blocks % stages):
        return None
    q, r = divmod(num_blocks, stages)
    bounds, first = [], 1
    for s in range(stages - 1):
        first += q + (1 if s < r else 0)
        bounds.append(first)
    return tuple(bounds)


def proportional_bounds(num_blocks: int, weights: list[float]) -> tuple[int, ...] | None:
    """Blocks shared out in proportion to `weights` (largest remainders), at least one per stage."""
    P = len(weights)
    if P > num_blocks:
        return None
    total = sum(weights)
    raw = [num_blocks * w / total for w in weights]
    counts = [max(1, int(x)) for x in raw]
    while sum(counts) > num_blocks:  # the floor of one per stage overshot: take from the largest
        counts[max(range(P), key=lambda s: counts[s])] -= 1
    order = sorted(range(P), key=lambda s: raw[s] - int(raw[s]), reverse=True)
    i = 0
    while sum(counts) < num_blocks:
        counts[order[i % P]] += 1
        i += 1
    return bounds_from_counts(counts)


def bounds_from_counts(block_counts: list[int]) -> tuple[int, ...]:
    bounds, first = [], 1
    for n in block_counts[:-1]:
        first += n
        bounds.append(first)
    return tuple(bounds)


def stage_ranges(num_layers: int, bounds: tuple[int, ...]) -> list[tuple[int, int]]:
    firsts = (0, *bounds)
    lasts = (*(b - 1 for b in bounds), num_layers - 1)
    return list(zip(firsts, lasts))


def minmax_split(num_layers: int, stages: int, cost) -> tuple[float, tuple[int, ...]] | None:
    """The contiguous split into `stages` stages minimizing the largest cost(s, first, last).

    Dynamic program right to left (stage s knows how many stages follow it, so
    cost may depend on s, e.g. for memory). cost returns INF for a stage that
    may not hold those layers. None if no split is feasible.
    """
    L, P = num_layers, stages
    if P > L:
        return None
    # best[s][j]: (bottleneck, bounds) of layers j..L-1 in stages s..P-1
    best: list[dict[int, tuple[float, tuple[int, ...]]]] = [dict() for _ in range(P)]
    for j in range(P - 1, L):
        c = cost(P - 1, j, L - 1)
        if c < INF:
            best[P - 1][j] = (c, ())
    for s in range(P - 2, -1, -1):
        for j in range(s, L - (P - s) + 1):
            top = (INF, ())
            for i in range(j + 1, L - (P - s - 1) + 1):
                rest = best[s + 1].get(i)
                if rest is None or rest[0] >= top[0]:
                    continue
                c = cost(s, j, i - 1)
                value = c if c > rest[0] else rest[0]
                if value < top[0]:
                    top = (value, (i, *rest[1]))
            if top[0] < INF:
                best[s][j] = top
    found = best[0].get(0)
    return found if found and found[0] < INF else None


# -- mapping GPUs to replicas -------------------------------------------------
def uniform_layouts(devs: list[Device], configs, stage_counts, global_batch: int):
    """(mbs, tp, P, D, replicas) of every uniform TP x PP x DP layout of all `devs` (N = tp * P * D)
    whose D pipelines split the batch evenly, ranks in Megatron's order (see rank_order)."""
    N = len(devs)
    for mbs, tp in configs:
        for P in stage_counts:
            if N % (tp * P):
                continue
            D = N // (tp * P)
            if global_batch % (D * mbs):
                continue
            replicas = rank_order(devs, D, [tp] * P)
            if replicas is not None:
                yield mbs, tp, P, D, replicas


def rank_order(devs: list[Device], replicas: int, tps: list[int]) -> list[list[Replica]] | None:
    """Megatron's rank order: stage s takes the next D * tp_s GPUs, replica k the k-th tp_s of them.

    None if a replica's GPUs are not all of one type in one zone (a TP group
    cannot span pools), or there are too few GPUs.
    """
    out, i = [], 0
    for tp in tps:
        stage = []
        for _ in range(replicas):
            group = devs[i:i + tp]
            if len(group) < tp or any(d != group[0] for d in group):
                return None
            stage.append(Replica(group[0][0], tp, group[0][1]))
            i += tp
        out.append(stage)
    return out


def make_plan(sim: Simulator, global_batch: int, bounds: tuple[int, ...], replicas: list[list[Replica]],
              mbs: int, microbatches: list[int], runtime: str, recompute: bool = False) -> Plan:
    ranges = stage_ranges(sim.model.num_layers, bounds)
    stages = tuple(Stage(f, last, tuple(reps), recompute) for (f, last), reps in zip(ranges, replicas))
    return with_model(Plan(sim.model.name, global_batch, stages, tuple(Pipeline(mbs, m) for m in microbatches),
                           runtime), sim.model)


def even_shares(global_batch: int, mbs: int, pipelines: int) -> list[int] | None:
    """Microbatches per pipeline when the batch is split evenly (None if some pipeline would get none)."""
    M = global_batch // mbs
    if global_batch % mbs or M < pipelines:
        return None
    return list(spread(M, pipelines))


def balanced_shares(global_batch: int, mbs: int, speeds: list[float]) -> list[int] | None:
    """Microbatches per pipeline in proportion to its speed (largest remainders, at least one each)."""
    M, D = global_batch // mbs, len(speeds)
    if global_batch % mbs or M < D:
        return None
    total = sum(speeds)
    raw = [M * v / total for v in speeds]
    counts = [max(1, int(x)) for x in raw]
    while sum(counts) > M:
        counts[max(range(D), key=lambda k: counts[k] - raw[k])] -= 1
    order = sorted(range(D), key=lambda k: raw[k] - counts[k], reverse=True)
    i = 0
    while sum(counts) < M:
        counts[order[i % D]] += 1
        i += 1
    return counts


def fits_available(plan: Plan, cluster: Cluster) -> bool:
    """Do the plan's replicas, laid on nodes by the simulator's placement rule, fit the GPUs given?

    Per pool: no more nodes than the pool has (a last partial node holds only
    its GPUs); per zone: its quota.
    """
    nodes = place(plan, cluster)
    use: dict = defaultdict(lambda: defaultdict(int))  # (gpu, zone) -> node -> GPUs
    for s, st in enumerate(plan.stages):
        for k, r in enumerate(st.replicas):
            use[(r.gpu, r.zone)][nodes[s][k]] += r.tp
    have: dict = defaultdict(int)
    for p in cluster.available:
        have[(cluster.gpu(p.gpu).name, p.zone)] += p.count
    zone_use: dict = defaultdict(int)
    for (gpu, zone), per_node in use.items():
        n = cluster.gpu(gpu).gpus_per_node
        full, partial = divmod(have[(gpu, zone)], n)
        loads = sorted(per_node.values(), reverse=True)
        if len(loads) > full + (1 if partial else 0):
            return False
        if len(loads) > full and loads[full] > partial:
            return False
        zone_use[zone] += sum(loads)
    return all(zone_use[z] <= q for z, q in cluster.quotas.items())


def most_pipelines(sim: Simulator, devs: list[Device], tps: list[int], at_most: int) -> int:
    """The most pipelines (<= at_most) of stages with TP degrees `tps` that rank order lays on the GPUs
    given and the nodes can hold (0 if none)."""
    bounds = tuple(range(1, len(tps)))  # any split: placement only looks at replicas
    for D in range(min(at_most, len(devs) // sum(tps)), 0, -1):
        replicas = rank_order(devs, D, tps)
        if replicas is None:
            continue
        probe = make_plan(sim, D, bounds, replicas, 1, [1] * D, "sailor")
        if fits_available(probe, sim.cluster):
            return D
    return 0


def pipeline_estimate(stage_times: list[float], boundary_s: list[float], microbatches: int) -> float:
    """The textbook 1F1B time: fill and drain through every stage, then the slowest stage per microbatch.

        T = sum_s t_s + 2 sum_b c_b + (m - 1) max_s t_s

    (p2p counted on the fill/drain path only; our simulator also charges it in the steady state.)
    """
    return sum(stage_times) + 2 * sum(boundary_s) + (microbatches - 1) * max(stage_times)
