"""The planner: co-optimize which GPUs to use and how to parallelize over them.

Search space (every plan in it is one the runtime can execute):

  * a microbatch size b shared by all pipelines (b divides the global batch;
    its M = gbs/b microbatches are spread over the D pipelines as evenly as
    possible, so a pipeline runs ceil(M/D) or one fewer);
  * P pipeline stages and any contiguous split of the layers into them;
  * a GPU type and a TP degree for the stages (see designs.py for designs that
    give the first stages another pool);
  * the number of pipelines D, spread over the zones that have the GPU type:
    cheapest zones first, then those with most GPUs, each zone filled before
    the next; zone quotas and GPU counts are respected;
  * placement on nodes by the simulator's rule (simulator/placement.py).

Exactness. For such a plan the simulator's iteration time is

    T = max_zones [ sum(F+B) + 2 (P-1) c_z + (m_z - 1) * slot(split, c_z) ] + sync(D, G(split)) + u * G(split)

with m = ceil(M/D). For a fixed m the smallest D is best for every objective
(more replicas only add sync time, GPUs and egress), and for fixed (P, m, D)
the best split is on the (slot, G) Pareto frontier that partition.SplitTable
computes exactly. The search enumerates every (type, b, TP, P, m), orders them
by a lower bound of their objective (perfect balance, the smallest possible
largest stage), and evaluates them best-first until the bound cannot beat the
K-th best plan found: branch and bound, so the result is the optimum of the
space. Every returned plan is re-simulated and must agree with the search to
1e-9; tests/planner/test_search.py compares with brute force on small clusters.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field, replace

from planner.errors import SailorError
from planner.profiles.profile import Profile
from planner.search.goal import Goal, Outcome
from planner.search.partition import JointSplitTable, SplitTable, StageCosts, pareto as pareto_front
from planner.simulator.network import Endpoint
from planner.simulator.runtime_model import RuntimeModel, runtime_model
from planner.simulator.simulate import Estimate, Simulator
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


@dataclass(frozen=True)
class Candidate:
    score: float
    outcome: Outcome
    design: tuple  # arguments of Planner._design


@dataclass
class Result:
    plans: list[tuple[Plan, Estimate]]  # best first
    search_time_s: float
    evaluated: int
    pareto: list[tuple[Plan, Estimate]] = field(default_factory=list)


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
    tables: dict = field(default_factory=dict)


GROUP, FAMILY, CONFIG, REFINE, EVALUATE = 0, 1, 2, 3, 4  # what a queue entry asks for
# Two-pool designs put up to this many first stages on the first pool: another GPU type
# (cheap or memory-light GPUs for the first stages), or the same type in another zone.
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


def ring_edges_of(gpu: str, tp: int, placed: list[tuple[str, int]], per_node_replicas: int):
    """Distinct edges of a stage's gradient ring (as network.ring_edges of the placed plan)."""
    counts: dict = {}

    def add(za, zb, same, n=1):
        if n > 0:
            key = (Endpoint(gpu, za, 0, tp), Endpoint(gpu, zb, 0 if same else 1, tp))
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
    return [(a, b, n) for (a, b), n in counts.items()]


class Planner:
    def __init__(self, sim: Simulator, global_batch: int, goal: Goal, runtime: str = "sailor",
                 max_stages: int | None = None, microbatch_sizes: list[int] | None = None, two_pools: bool = True,
                 two_classes: bool = True):
        if global_batch < 1:
            raise SailorError("--global-batch must be positive")
        if not sim.cluster.available:
            raise SailorError("no GPUs to plan on: give --gpus TYPE@ZONE=COUNT,... or a cluster file with 'available'")
        self.sim, self.gbs, self.goal = sim, global_batch, goal
        self.rt: RuntimeModel = runtime_model(runtime)
        self.runtime = runtime
        self.model = sim.model
        self.L = self.model.num_layers
        self.max_stages = min(max_stages or self.L, self.L)
        self.mbs_filter = set(microbatch_sizes) if microbatch_sizes else None
        self.two_pools = two_pools  # also search designs whose first stages run on another pool
        self.two_classes = two_classes  # also search plans with pipelines of two GPU types
        self.evaluated = 0
        self._sync_cache: dict = {}
        self._front_cache: dict = {}

    # -- setting up ---------------------------------------------------------
    def _zones(self, gpu: str) -> list[tuple[str, int]]:
        """(zone, usable GPUs) of a type, in fill order: cheapest, then fastest network, then largest."""
        cluster, net = self.sim.cluster, self.sim.network
        merged: dict[str, int] = {}
        for p in cluster.available:
            if p.gpu == gpu:
                merged[p.zone] = merged.get(p.zone, 0) + p.count
        for z in merged:
            if z in cluster.quotas:
                merged[z] = min(merged[z], cluster.quotas[z])
        zones = [(z, n) for z, n in merged.items() if n > 0]

        def speed(z):  # node-to-node bandwidth inside the zone, one GPU, 64 MB messages
            return net.bytes_per_s(64e6, Endpoint(gpu, z, 0, 1), Endpoint(gpu, z, 1, 1))

        return sorted(zones, key=lambda zn: (cluster.price_per_hour(gpu, zn[0], cluster.is_spot(gpu, zn[0])),
                                             -speed(zn[0]), -zn[1], zn[0]))

    def shapes(self) -> list[Shape]:
        sim, model, out = self.sim, self.model, []
        for gpu in sorted({p.gpu for p in sim.cluster.available}):
            zones = self._zones(gpu)
            if not zones:
                continue
            spec = sim.cluster.gpu(gpu)
            profile: Profile = sim.profile(gpu)
            prices = {z: sim.cluster.price_per_hour(gpu, z, sim.cluster.is_spot(gpu, z)) / 3600 for z, _ in zones}
            for mbs in profile.microbatch_sizes():
                if self.gbs % mbs or (self.mbs_filter and mbs not in self.mbs_filter):
                    continue
                for tp in profile.tp_degrees():
                    if tp > spec.gpus_per_node or (mbs, tp) not in profile.times or tp not in profile.memory:
                        continue
                    mem = profile.layer_memory(tp)
                    costs = StageCosts(profile.times[(mbs, tp)], mem, profile.layer_memory(1), mbs=mbs,
                                       state_bytes=self.rt.state_bytes(sim.precision),
                                       allocator=self.rt.allocator_factor, overhead=spec.runtime_overhead_bytes,
                                       capacity=spec.memory_bytes,
                                       tied_params=mem.params[0] if model.tied_embeddings else 0)
                    comm = {(z, same): self._boundary(gpu, z, tp, mbs, profile, same)
                            for z, _ in zones for same in (True, False)}
                    out.append(Shape(gpu, mbs, tp, spec.gpus_per_node, zones, costs, comm,
                                     profile.optimizer_s_per_param / tp, prices))
        return out

    def _boundary(self, gpu: str, zone: str, tp: int, mbs: int, profile: Profile, same_node: bool) -> float:
        """p2p seconds of one stage boundary in `zone` (every boundary carries one h-sized activation)."""
        x = mbs * profile.layer_memory(1).output_bytes[1]
        links = tp if self.rt.p2p_split_over_tp else 1
        return self.sim.network.p2p_time(x, Endpoint(gpu, zone, 0, links),
                                         Endpoint(gpu, zone, 0 if same_node else 1, links))

    # -- search -------------------------------------------------------------
    def run(self, top: int = 1, pareto: bool = False) -> Result:
        """Best-first branch and bound over families of configurations.

        A family (shape and stage count; or two pools, TP degrees and stage
        counts) expands into one configuration per distinct microbatch count;
        both carry a lower bound of their objective. Popping in bound order,
        the search stops once a bound cannot beat the K-th best plan found.
        """
        t0 = time.process_time()
        best: list = []  # heap of (-score, seq, candidate): the K best so far
        front: list[Candidate] = []
        queue: list = []  # (bound, seq, step, function, args)
        seq = itertools.count()
        shapes = self.shapes()
        for shape in shapes:
            for P in range(1, min(self.max_stages, sum(c for _, c in shape.zones) // shape.tp) + 1):
                fam = self._single_family(shape, P)
                if fam is not None:
                    heapq.heappush(queue, (fam[0], next(seq), FAMILY, self._single_configs, fam[1]))
        for a, b in self._pool_pairs(shapes) if self.two_pools else ():
            heapq.heappush(queue, (self._two_pool_bound(a, b), next(seq), GROUP, self._two_pool_families, (a, b)))
        # pipelines of two types side by side: for throughput (for cost, the cheaper type per
        # microbatch alone is as cheap up to fill and sync; see docs/planner.md)
        classes = self.two_classes and self.goal.objective == "throughput"
        for x, y in self._class_pairs(shapes) if classes else ():
            for P in range(1, self.max_stages + 1):
                fam = self._two_class_family(x, y, P)
                if fam is not None:
                    heapq.heappush(queue, (fam[0], next(seq), FAMILY, self._two_class_configs, fam[1]))
        while queue:
            bound, _, step, fn, args = heapq.heappop(queue)
            if not pareto and len(best) == top and bound >= -best[0][0]:
                break  # nothing left can enter the top K
            if step == GROUP:  # expand into families
                for fam_bound, fam in fn(*args):
                    heapq.heappush(queue, (fam_bound, next(seq), FAMILY, self._two_pool_configs, fam))
            elif step == FAMILY:  # expand into configurations, bounded cheaply
                configs = fn(*args)  # throughput bounds grow with m: already in order
                if self.goal.objective != "throughput":
                    configs = iter(sorted(configs, key=lambda c: c[0]))
                nxt = next(configs, None)
                if nxt is not None:
                    heapq.heappush(queue, (nxt[0], next(seq), CONFIG, nxt, configs))
            elif step == CONFIG:  # a configuration; the rest of its family waits behind it
                cfg_bound, refine, cfg = fn
                heapq.heappush(queue, (cfg_bound, next(seq), REFINE, refine, cfg))
                nxt = next(args, None)
                if nxt is not None:
                    heapq.heappush(queue, (nxt[0], next(seq), CONFIG, nxt, args))
            elif step == REFINE:  # add a lower bound of the gradient sync, then queue again
                extra, usd, evaluate, cfg = fn(*args)
                if pareto and self.goal.objective == "throughput":  # bound is a time: prune dominated configs
                    t_lb = bound + extra
                    if any(f.outcome.iteration_time_s <= t_lb and f.outcome.cost_per_iteration_usd <= t_lb * usd
                           for f in front):
                        continue
                heapq.heappush(queue, (bound + extra, next(seq), EVALUATE, evaluate, cfg))
            else:
                fn(*args, best, front, top, pareto)
        ranked = sorted((entry[2] for entry in best), key=lambda c: c.score)
        plans = [self._materialize(c) for c in ranked]
        frontier = [self._materialize(c) for c in sorted(front, key=lambda c: c.outcome.iteration_time_s)]
        return Result(plans, time.process_time() - t0, self.evaluated, frontier)

    def _bound(self, t_lb: float, usd_per_s: float) -> float:
        return t_lb if self.goal.objective == "throughput" else t_lb * usd_per_s

    def _could_admit(self, t_lb: float, usd_per_s: float) -> bool:
        """False if lower bounds of time and price already break a limit of the goal."""
        g = self.goal
        return not ((g.min_throughput and t_lb * g.min_throughput > 1 + 1e-12)
                    or (g.max_cost_per_iteration and t_lb * usd_per_s > g.max_cost_per_iteration)
                    or (g.max_cost_per_hour and usd_per_s * 3600 > g.max_cost_per_hour))

    def _microbatch_counts(self, M: int, d_cap: int):
        """(m, D): every distinct per-pipeline microbatch count with the fewest pipelines giving it."""
        last_D = None
        for m in range(math.ceil(M / d_cap), M + 1):
            D = math.ceil(M / m)
            if D != last_D:
                last_D = D
                yield m, D

    # -- designs on one GPU type --------------------------------------------
    def _single_family(self, shape: Shape, P: int):
        costs, tp, n = shape.costs, shape.tp, shape.per_node
        M = self.gbs // shape.mbs
        caps = [capacity(cnt, n, P, tp) for _, cnt in shape.zones]
        d_cap = min(sum(caps), M)
        if self.goal.max_gpus is not None:
            d_cap = min(d_cap, self.goal.max_gpus // (P * tp))
        if d_cap < 1:
            return None
        same_node = P * tp <= n
        c_min = min(shape.comm[(z, same_node)] for z, _ in shape.zones) if P > 1 else 0.0
        fb_total, params_total = costs.compute(0, self.L - 1), costs.params(0, self.L - 1)
        fill = fb_total + 2 * (P - 1) * c_min
        slot_lb = (fb_total + 4 * (P - 1) * c_min) / P  # the bottleneck is at least the average stage
        upd = shape.u * params_total / P
        price = min(shape.prices.values()) * P * tp
        m_min = math.ceil(M / d_cap)
        if not self._could_admit(fill + (m_min - 1) * slot_lb + upd, 0.0):
            return None
        if self.goal.objective == "throughput":
            # with D >= 2 pipelines there is a ring to sync, and it is at least as slow as a ring of two
            per = n // (P * tp) if same_node else n // tp
            two = self._sync(math.ceil(params_total / P), 2, shape.gpu, tp, ((shape.zones[0][0], 2),), per)[0]
            bound = min(fill + (M - 1) * slot_lb + upd, fill + (m_min - 1) * slot_lb + upd + two)
        else:
            bound = min(self._bound(fill + (m - 1) * slot_lb + upd, price * math.ceil(M / m)) for m in (m_min, M))
        return bound, (shape, P, caps, d_cap, fill, slot_lb, upd)

    def _single_configs(self, shape, P, caps, d_cap, fill, slot_lb, upd):
        tp = shape.tp
        for m, D in self._microbatch_counts(self.gbs // shape.mbs, d_cap):
            placed, left = [], D
            for (z, _), cap in zip(shape.zones, caps):
                k = min(cap, left)
                if k:
                    placed.append((z, k))
                    left -= k
            usd = sum(k * P * tp * shape.prices[z] for z, k in placed)
            t_lb = fill + (m - 1) * slot_lb + upd
            if self._could_admit(t_lb, usd):
                yield self._bound(t_lb, usd), self._refine_single, (shape, P, D, m, placed)

    def _refine_single(self, shape: Shape, P: int, D: int, m: int, placed):
        """What a tighter bound adds: the largest stage holds at least the average number of parameters."""
        n, tp = shape.per_node, shape.tp
        sync = self._sync(math.ceil(shape.costs.params(0, self.L - 1) / P), D, shape.gpu, tp, tuple(placed),
                          n // (P * tp) if P * tp <= n else n // tp)[0]
        usd = sum(k * P * tp * shape.prices[z] for z, k in placed)
        return self._bound(sync, usd), usd, self._evaluate_single, (shape, P, D, m, placed)

    def _table(self, shape: Shape, comm: float, m: int, P: int) -> SplitTable:
        key = (comm, m if m < P else None)
        if key not in shape.tables:
            shape.tables[key] = SplitTable(shape.costs, comm, m if m < P else self.max_stages, self.max_stages)
        return shape.tables[key]

    def _evaluate_single(self, shape: Shape, P: int, D: int, m: int, placed, best, front, top, pareto) -> None:
        costs, tp, n = shape.costs, shape.tp, shape.per_node
        same_node = P * tp <= n
        c = {z: (shape.comm[(z, same_node)] if P > 1 else 0.0) for z, _ in placed}
        splits = self._table(shape, max(c.values()), m, P).frontier(P)
        if not splits:
            return  # no split fits in memory
        micro = spread(self.gbs // shape.mbs, D)
        per = n // (P * tp) if same_node else n // tp
        gpus_per_zone = tuple((z, k * P * tp) for z, k in placed)
        usd_per_s = sum(g * shape.prices[z] for z, g in gpus_per_zone)
        busiest, k0 = [], 0  # (c, microbatches) of the busiest pipeline in each zone
        for z, k in placed:
            busiest.append((c[z], micro[k0]))
            k0 += k
        fb_total = costs.compute(0, self.L - 1)
        zones_k = tuple(z for z, k in placed for _ in range(k))  # the zone of each pipeline
        for _, params, bounds in splits:
            t_pp = max(fb_total + 2 * (P - 1) * cz + (mz - 1) * self._slot(costs, bounds, cz) for cz, mz in busiest)
            sync, egress = self._sync(params, D, shape.gpu, tp, tuple(placed), per)
            T = t_pp + sync + shape.u * params
            self._consider(Outcome(T, T * usd_per_s + egress, D * P * tp, gpus_per_zone),
                           (shape.mbs, ((shape.gpu, tp, P, zones_k),), bounds, D), best, front, top, pareto)

    # -- designs whose first one or two stages run on another pool ------------
    def _pool_pairs(self, shapes: list[Shape]):
        """(A, B): pool shapes with the same microbatch size on different pools (type or zone)."""
        pools = [replace(sh, zones=[zone], tables=sh.tables) for sh in shapes for zone in sh.zones]
        for a in pools:
            for b in pools:
                if a.mbs == b.mbs and (a.gpu, a.zones[0][0]) != (b.gpu, b.zones[0][0]):
                    yield a, b

    @staticmethod
    def _first_pool_stages(a: Shape, b: Shape) -> int:
        return FIRST_POOL_STAGES["other type" if a.gpu != b.gpu else "other zone"]

    def _two_pool_bound(self, a: Shape, b: Shape) -> float:
        """A lower bound over every (P1, P2) family of the pair (cheap: no family is built).

        Any pipeline computes at least `least` seconds per microbatch; with P stages
        its bottleneck is at least least/P; D pipelines fit pool A with P1 stages
        (at most cap_a) and pool B with P2 stages (at most count_b / (P2 tp_b)), so
        (m - 1)/P >= (M/min(cap_a, B/P2) - 1)/(P1 + P2), smallest at P2 = B/cap_a.
        For cost, every pipeline pays at least M * least/P seconds of P GPUs.
        """
        L, M = self.L, self.gbs // a.mbs
        fa, fb = a.costs.fb, b.costs.fb
        least = min(fa[q] + fb[L] - fb[q] for q in range(1, L))
        (za, na), (zb, nb) = a.zones[0], b.zones[0]
        if self.goal.objective != "throughput":
            return M * least * min(a.tp * a.prices[za], b.tp * b.prices[zb])
        B = nb / b.tp
        best = math.inf
        for P1 in range(1, self._first_pool_stages(a, b) + 1):
            cap_a = capacity(na, a.per_node, P1, a.tp)
            if cap_a < 1:
                continue
            for P2 in {max(1, math.floor(B / cap_a)), max(1, math.ceil(B / cap_a))}:
                d = min(cap_a, B / P2, M)
                best = min(best, (max(M / d, 1) - 1) / (P1 + P2))
        return least * (1 + best) if best < math.inf else math.inf

    def _two_pool_families(self, a: Shape, b: Shape):
        """(bound, args) of every (P1, P2) design on pools A then B."""
        L, M = self.L, self.gbs // a.mbs
        (za, na), (zb, nb) = a.zones[0], b.zones[0]
        fa, fb = a.costs.fb, b.costs.fb
        c_ab = self._cross(a, b)
        params_total = a.costs.params(0, L - 1)
        u = min(a.u, b.u)
        quota = self.sim.cluster.quotas.get(za) if za == zb else None
        throughput = self.goal.objective == "throughput"
        for P1 in range(1, self._first_pool_stages(a, b) + 1):
            cap_a = capacity(na, a.per_node, P1, a.tp)
            c_a = a.comm[(za, P1 * a.tp <= a.per_node)] if P1 > 1 else 0.0
            least, run = {}, math.inf  # least compute of one microbatch over where pool B starts
            for q in range(P1, L):
                run = min(run, fa[q] + fb[L] - fb[q])
                least[q] = run
            for P2 in range(1, min(self.max_stages - P1, L - P1) + 1):
                per_pipe = P1 * a.tp + P2 * b.tp
                d_cap = min(cap_a, capacity(nb, b.per_node, P2, b.tp), M)
                if quota is not None:
                    d_cap = min(d_cap, quota // per_pipe)
                if self.goal.max_gpus is not None:
                    d_cap = min(d_cap, self.goal.max_gpus // per_pipe)
                if d_cap < 1:
                    continue
                c_b = b.comm[(zb, P2 * b.tp <= b.per_node)] if P2 > 1 else 0.0
                comm = (P1 - 1) * c_a + c_ab + (P2 - 1) * c_b
                P, fb_min = P1 + P2, least[L - P2]
                fill, slot_lb, upd = fb_min + 2 * comm, (fb_min + 4 * comm) / P, u * params_total / P
                usd = P1 * a.tp * a.prices[za] + P2 * b.tp * b.prices[zb]
                m_min = math.ceil(M / d_cap)
                if not self._could_admit(fill + (m_min - 1) * slot_lb + upd, 0.0):
                    continue
                if throughput:
                    bound = fill + (m_min - 1) * slot_lb + upd
                else:
                    bound = min((fill + (m - 1) * slot_lb + upd) * usd * math.ceil(M / m) for m in (m_min, M))
                yield bound, (a, b, P1, P2, d_cap, (c_a, c_ab, c_b), fill, slot_lb, upd, usd)

    def _cross(self, a: Shape, b: Shape) -> float:
        """p2p seconds of the boundary between the two pools (never on one node)."""
        x = a.mbs * self.sim.profile(a.gpu).layer_memory(1).output_bytes[1]
        la, lb = (a.tp, b.tp) if self.rt.p2p_split_over_tp else (1, 1)
        return self.sim.network.p2p_time(x, Endpoint(a.gpu, a.zones[0][0], 0, la), Endpoint(b.gpu, b.zones[0][0], 1, lb))

    def _two_pool_configs(self, a, b, P1, P2, d_cap, comms, fill, slot_lb, upd, usd):
        for m, D in self._microbatch_counts(self.gbs // a.mbs, d_cap):
            t_lb = fill + (m - 1) * slot_lb + upd
            if self._could_admit(t_lb, usd * D):
                yield self._bound(t_lb, usd * D), self._refine_two_pool, (a, b, P1, P2, D, m, comms)

    def _refine_two_pool(self, a: Shape, b: Shape, P1, P2, D, m, comms):
        """A tighter bound: some stage, on A or on B, holds at least the average number of parameters."""
        avg = math.ceil(a.costs.params(0, self.L - 1) / (P1 + P2))
        sync = min(self._pool_sync(avg, a, P1, D)[0], self._pool_sync(avg, b, P2, D)[0])
        usd = D * (P1 * a.tp * a.prices[a.zones[0][0]] + P2 * b.tp * b.prices[b.zones[0][0]])
        return self._bound(sync, usd), usd, self._evaluate_two_pool, (a, b, P1, P2, D, m, comms, sync)

    def _pool_sync(self, params: int, shape: Shape, stages: int, D: int) -> tuple:
        return self._sync(params, D, shape.gpu, shape.tp, ((shape.zones[0][0], D),), self._per_node(shape, stages))

    def _evaluate_two_pool(self, a: Shape, b: Shape, P1, P2, D, m, comms, sync_lb, best, front, top,
                           pareto) -> None:
        L, P = self.L, P1 + P2
        c_a, c_ab, c_b = comms
        (za, _), (zb, _) = a.zones[0], b.zones[0]
        ca, cb = a.costs, b.costs
        fronts_a = self._fronts_first(a, P1, c_a, c_ab, tuple(min(P - st, m) for st in range(P1)))
        fronts_b = self._fronts_rest(b, P2, c_ab, c_b, m)
        micro = spread(self.gbs // a.mbs, D)
        upd_lb = min(a.u, b.u) * ca.params(0, L - 1) / P
        x = a.mbs * self.sim.profile(a.gpu).layer_memory(1).output_bytes[1]
        egress = 0.0 if za == zb else self.gbs // a.mbs * x * (
            self.sim.cluster.egress_per_gb(za, zb) + self.sim.cluster.egress_per_gb(zb, za)) / 1e9
        usd_per_s = D * (P1 * a.tp * a.prices[za] + P2 * b.tp * b.prices[zb])
        used: dict[str, int] = {}
        for z, g in ((za, D * P1 * a.tp), (zb, D * P2 * b.tp)):
            used[z] = used.get(z, 0) + g
        gpus_per_zone, gpus = tuple(used.items()), D * (P1 * a.tp + P2 * b.tp)
        bubbles = micro[0] - 1
        for q in range(P1, L - P2 + 1):  # the first layer of the second pool
            front_a, front_b = fronts_a[q], fronts_b.get(q)
            if not front_a or not front_b:
                continue
            fill = ca.compute(0, q - 1) + cb.compute(q, L - 1) + 2 * ((P1 - 1) * c_a + c_ab + (P2 - 1) * c_b)
            full = not pareto and len(best) == top
            for slot_a, params_a, bounds_a in front_a:
                sync_a = self._pool_sync(params_a, a, P1, D)
                for slot_b, params_b, bounds_b in front_b:
                    t_pp = fill + bubbles * (slot_a if slot_a > slot_b else slot_b)
                    if full and self._bound(t_pp + sync_lb + upd_lb, usd_per_s) >= -best[0][0]:
                        continue  # cannot enter the top K, whatever its sync
                    sync_b = self._pool_sync(params_b, b, P2, D)
                    T = t_pp + max(sync_a[0], sync_b[0]) + max(a.u * params_a, b.u * params_b)
                    cost = T * usd_per_s + egress + sync_a[1] + sync_b[1]
                    self._consider(Outcome(T, cost, gpus, gpus_per_zone),
                                   (a.mbs, ((a.gpu, a.tp, P1, za), (b.gpu, b.tp, P2, zb)), (*bounds_a, *bounds_b), D),
                                   best, front, top, pareto)

    def _fronts_first(self, a: Shape, P1: int, c_a: float, c_ab: float, inflights: tuple[int, ...]) -> list:
        """For each first layer q of pool B: the (slot, params) frontier of layers 0..q-1 in P1 stages on A.

        Left to right: front[j] holds the splits of layers 0..j-1 into k stages, each of which
        has a stage after it on A (p2p c_a on its right, and on its left but for the first);
        the last stage of A then ends at q with the crossing to B (c_ab) on its right.
        inflights[s] is stage s's 1F1B in-flight count.
        """
        key = ("first", id(a.costs), P1, c_a, c_ab, inflights)
        if key not in self._front_cache:
            ca, L = a.costs, self.L
            fits = [ca.last_fit(f) for f in inflights]
            front = {j: [(ca.compute(0, j - 1) + 2 * c_a, ca.params(0, j - 1), ())]
                     for j in range(1, L) if fits[0][0] >= j - 1}  # one stage, more to come
            for k in range(1, P1 - 1):  # middle stages of A
                nxt = {}
                for j in range(k + 1, L):
                    cell = [(max(s1, ca.compute(i, j - 1) + 4 * c_a), max(p1, ca.params(i, j - 1)), (*b1, i))
                            for i in range(k, j) if fits[k][i] >= j - 1 for s1, p1, b1 in front.get(i, ())]
                    if cell:
                        nxt[j] = pareto_front(cell)
                front = nxt
            out = [[] for _ in range(L + 1)]
            for q in range(P1, L):
                if P1 == 1:
                    if fits[0][0] >= q - 1:
                        out[q] = [(ca.compute(0, q - 1) + 2 * c_ab, ca.params(0, q - 1), ())]
                    continue
                last = P1 - 1  # the stage of A that hands over to B
                cell = [(max(s1, ca.compute(i, q - 1) + 2 * (c_a + c_ab)), max(p1, ca.params(i, q - 1)), (*b1, i))
                        for i in range(last, q) if fits[last][i] >= q - 1 for s1, p1, b1 in front.get(i, ())]
                out[q] = pareto_front(cell) if cell else []
            self._front_cache[key] = out
        return self._front_cache[key]

    def _fronts_rest(self, b: Shape, P2: int, c_ab: float, c_b: float, m: int) -> dict:
        """For each first layer q of pool B: the frontier of layers q..L-1 in P2 stages on B."""
        key = ("rest", id(b.costs), P2, c_ab, c_b, min(m, P2))
        if key not in self._front_cache:
            cb, L = b.costs, self.L
            out = {}
            if P2 == 1:
                fit = cb.last_fit(1)
                for q in range(1, L):
                    if fit[q] >= L - 1:
                        out[q] = [(cb.compute(q, L - 1) + 2 * c_ab, cb.params(q, L - 1), (q,))]
            else:
                table, fit = self._table(b, c_b, m, P2), cb.last_fit(min(P2, m))
                for q in range(1, L - P2 + 1):
                    cell = []
                    for i in range(q + 1, min(L - P2 + 1, fit[q] + 1) + 1):
                        slot, params = cb.compute(q, i - 1) + 2 * (c_ab + c_b), cb.params(q, i - 1)
                        cell += [(max(slot, s2), max(params, p2), (q, *b2)) for s2, p2, b2 in table.table[i][P2 - 2]]
                    if cell:
                        out[q] = pareto_front(cell)
            self._front_cache[key] = out
        return self._front_cache[key]

    def _sync(self, params: int, D: int, gpu: str, tp: int, placed: tuple, per_node_replicas: int) -> tuple:
        """(seconds, egress USD) of one stage's gradient ring; cached, the search asks again and again."""
        key = (params, D, gpu, tp, placed, per_node_replicas)
        if key not in self._sync_cache:
            edges = ring_edges_of(gpu, tp, list(placed), per_node_replicas)
            self._sync_cache[key] = self.sim.edges_sync(params, D, edges) if D > 1 else (0.0, 0.0)
        return self._sync_cache[key]

    # -- pipelines of two GPU types, side by side --------------------------------
    def _class_pairs(self, shapes: list[Shape]):
        """(X, Y): two GPU types (each over all its zones) with the same microbatch size."""
        for x in shapes:
            for y in shapes:
                if x.mbs == y.mbs and x.gpu < y.gpu:
                    yield x, y

    def _balance(self, M: int, P: int, classes) -> tuple[float, int] | None:
        """Least pipeline time over how M microbatches split between two classes.

        classes = [(D, fill, slot), (D, fill, slot)]: class c's pipelines take
        at most m_c microbatches (its busiest pipeline), at least P so the
        1F1B in-flight count is P - s, and every pipeline gets at least one.
        Returns (time, m of the first class) or None.
        """
        (dx, fx, sx), (dy, fy, sy) = classes

        def times(mx):  # (X's time, Y's time), or None if Y would run fewer than P microbatches
            my = math.ceil((M - min(dx * mx, M - dy)) / dy)
            return None if my < P else (fx + (mx - 1) * sx, fy + (my - 1) * sy)

        return crossing(P, math.ceil((M - dy) / dx), times)

    def _two_class_family(self, x: Shape, y: Shape, P: int):
        M = self.gbs // x.mbs
        caps = []
        for sh in (x, y):
            d = sum(capacity(cnt, sh.per_node, P, sh.tp) for _, cnt in sh.zones)
            if self.goal.max_gpus is not None:
                d = min(d, self.goal.max_gpus // (P * sh.tp))
            caps.append(d)
        if min(caps) < 1 or caps[0] + caps[1] > M:
            caps = [min(c, M) for c in caps]
        if min(caps) < 1:
            return None
        lbs = []
        for sh in (x, y):
            same = P * sh.tp <= sh.per_node
            c = min(sh.comm[(z, same)] for z, _ in sh.zones) if P > 1 else 0.0
            fb = sh.costs.compute(0, self.L - 1)
            lbs.append((fb + 2 * (P - 1) * c, (fb + 4 * (P - 1) * c) / P))
        upd = min(x.u, y.u) * x.costs.params(0, self.L - 1) / P
        most = M // P  # every pipeline runs at least P microbatches
        if most < 2:
            return None
        ideal = self._balance(M, P, [(min(caps[0], most - 1), *lbs[0]), (min(caps[1], most - 1), *lbs[1])])
        if ideal is None:
            return None
        price = min(x.prices.values()) * P * x.tp + min(y.prices.values()) * P * y.tp  # one pipeline each
        bound = ideal[0] + upd if self.goal.objective == "throughput" else (ideal[0] + upd) * price
        return bound, (x, y, P, caps, lbs, upd)

    def _two_class_configs(self, x, y, P, caps, lbs, upd):
        """Configurations (D_X, D_Y), in bound order: each class runs as many pipelines as its GPUs
        hold, unless that exceeds M/P pipelines in all (each must run at least P microbatches);
        then every way to share the M/P pipelines between the classes."""
        M = self.gbs // x.mbs
        most = M // P
        if caps[0] + caps[1] <= most:
            pairs = [(caps[0], caps[1])]
        else:
            pairs = [(dx, most - dx) for dx in range(max(1, most - caps[1]), min(caps[0], most - 1) + 1)]
        out = []
        for dx, dy in pairs:
            ideal = self._balance(M, P, [(dx, *lbs[0]), (dy, *lbs[1])])
            if ideal is None:
                continue
            placed = [self._place_zones(sh, P, d) for sh, d in ((x, dx), (y, dy))]
            usd = sum(k * P * sh.tp * sh.prices[z] for sh, pl in zip((x, y), placed) for z, k in pl)
            if self._could_admit(ideal[0] + upd, usd) and self._within_quotas(x, y, P, placed):
                out.append((ideal[0] + upd, self._refine_two_class, (x, y, P, dx, dy, placed)))
        yield from sorted(out, key=lambda c: c[0])

    def _refine_two_class(self, x, y, P, dx, dy, placed):
        """What a tighter bound adds: the sync of an average stage over the mixed ring."""
        avg = math.ceil(x.costs.params(0, self.L - 1) / P)
        key = ("class-ring", x.gpu, x.tp, y.gpu, y.tp, P, tuple(placed[0]), tuple(placed[1]))
        if key not in self._sync_cache:
            self._sync_cache[key] = self._class_ring((x, y), P, placed)
        sync = self.sim.edges_sync(avg, dx + dy, self._sync_cache[key])[0]
        usd = sum(k * P * sh.tp * sh.prices[z] for sh, pl in zip((x, y), placed) for z, k in pl)
        return sync, usd, self._evaluate_two_class, (x, y, P, dx, dy, placed)

    def _place_zones(self, sh: Shape, P: int, D: int) -> list[tuple[str, int]]:
        placed, left = [], D
        for z, cnt in sh.zones:
            k = min(capacity(cnt, sh.per_node, P, sh.tp), left)
            if k:
                placed.append((z, k))
                left -= k
        return placed

    def _within_quotas(self, x: Shape, y: Shape, P: int, placed) -> bool:
        used: dict[str, int] = {}
        for sh, pl in zip((x, y), placed):
            for z, k in pl:
                used[z] = used.get(z, 0) + k * P * sh.tp
        return all(used.get(z, 0) <= q for z, q in self.sim.cluster.quotas.items())

    def _evaluate_two_class(self, x: Shape, y: Shape, P, dx, dy, placed, best, front, top, pareto) -> None:
        M = self.gbs // x.mbs
        shapes = (x, y)
        comms = []
        for sh, pl in zip(shapes, placed):
            same = P * sh.tp <= sh.per_node
            comms.append({z: (sh.comm[(z, same)] if P > 1 else 0.0) for z, _ in pl})
        key = ("classes", id(x.costs), id(y.costs), max(comms[0].values()), max(comms[1].values()))
        if key not in self._front_cache:
            self._front_cache[key] = JointSplitTable([x.costs, y.costs], [max(c.values()) for c in comms],
                                                     [self.max_stages] * 2, self.max_stages)
        splits = self._front_cache[key].frontier(P)
        edges = self._sync_cache[("class-ring", x.gpu, x.tp, y.gpu, y.tp, P, tuple(placed[0]), tuple(placed[1]))]
        gpus_per_zone: dict[str, int] = {}
        usd_per_s = 0.0
        for sh, pl in zip(shapes, placed):
            for z, k in pl:
                gpus_per_zone[z] = gpus_per_zone.get(z, 0) + k * P * sh.tp
                usd_per_s += k * P * sh.tp * sh.prices[z]
        gpus = sum(gpus_per_zone.values())
        u = max(x.u, y.u)
        for _, params, bounds in splits:
            # (c, fill, slot) of each zone of each class: the exact per-zone pipeline times
            zone_times = []
            for sh, cz, pl in zip(shapes, comms, placed):
                fb = sh.costs.compute(0, self.L - 1)
                zone_times.append([(fb + 2 * (P - 1) * cz[z], self._slot(sh.costs, bounds, cz[z]), k) for z, k in pl])
            def times(mx):  # exact (X's time, Y's time) when X's busiest pipeline runs mx microbatches
                m_x_total = min(dx * mx, M - dy)
                micro_x, micro_y = spread(m_x_total, dx), spread(M - m_x_total, dy)
                if micro_y[0] < P:
                    return None
                return self._class_time(zone_times[0], micro_x), self._class_time(zone_times[1], micro_y)

            found = crossing(P, math.ceil((M - dy) / dx), times)
            if found is None:
                continue
            m_x_total = min(dx * found[1], M - dy)
            best_split = (found[0], spread(m_x_total, dx), spread(M - m_x_total, dy))
            t_pp, micro_x, micro_y = best_split
            sync, egress = self.sim.edges_sync(params, dx + dy, edges)
            T = t_pp + sync + u * params
            zones_x = tuple(z for z, k in placed[0] for _ in range(k))
            zones_y = tuple(z for z, k in placed[1] for _ in range(k))
            self._consider(Outcome(T, T * usd_per_s + egress, gpus, tuple(gpus_per_zone.items())),
                           ("classes", x.mbs, ((x.gpu, x.tp, zones_x, micro_x), (y.gpu, y.tp, zones_y, micro_y)), bounds),
                           best, front, top, pareto)

    @staticmethod
    def _class_time(zone_times, micro) -> float:
        """Slowest pipeline of a class: each zone's first (busiest) pipeline, over that zone's links."""
        worst, k0 = 0.0, 0
        for fill, slot, k in zone_times:
            worst = max(worst, fill + (micro[k0] - 1) * slot)
            k0 += k
        return worst

    def _class_ring(self, shapes, P, placed):
        """Distinct edges of a stage's ring: the first class's replicas, then the second's."""
        counts: dict = {}
        ends = []
        for sh, pl in zip(shapes, placed):
            q = self._per_node(sh, P)
            for a, b, n in ring_edges_of(sh.gpu, sh.tp, pl, q):
                counts[(a, b)] = counts.get((a, b), 0) + n
            # drop this class's wrap-around edge: the ring goes on to the other class instead
            last_zone, first_zone = pl[-1][0], pl[0][0]
            same = len(pl) == 1 and math.ceil(pl[0][1] / q) == 1
            wrap = (Endpoint(sh.gpu, last_zone, 0, sh.tp), Endpoint(sh.gpu, first_zone, 0 if same else 1, sh.tp))
            counts[wrap] -= 1
            if not counts[wrap]:
                del counts[wrap]
            ends.append((sh, first_zone, last_zone))
        (sa, fa, la), (sb, fb, lb) = ends
        for src, dst in (((sa, la), (sb, fb)), ((sb, lb), (sa, fa))):
            key = (Endpoint(src[0].gpu, src[1], 0, src[0].tp), Endpoint(dst[0].gpu, dst[1], 1, dst[0].tp))
            counts[key] = counts.get(key, 0) + 1
        return [(a, b, n) for (a, b), n in counts.items()]

    @staticmethod
    def _per_node(shape: Shape, stages: int) -> int:
        """Replicas of one stage that share a node under the placement rule."""
        need = stages * shape.tp
        return shape.per_node // need if need <= shape.per_node else shape.per_node // shape.tp

    def _consider(self, outcome: Outcome, design: tuple, best, front, top, pareto) -> None:
        """`design` = (mbs, segments as (gpu, tp, stages, zone or zones), bounds, D): built only if kept."""
        self.evaluated += 1
        if self.goal.admits(outcome):
            self._offer(Candidate(self.goal.score(outcome), outcome, design), best, front, top, pareto)

    def _design(self, args: tuple) -> Design:
        if args[0] == "classes":
            return ClassDesign(*args[1:])
        mbs, segments, bounds, D = args
        segs = tuple(Segment(g, tp, n, (zones,) * D if isinstance(zones, str) else zones)
                     for g, tp, n, zones in segments)
        return Design(mbs, segs, bounds, spread(self.gbs // mbs, D))

    def _slot(self, costs: StageCosts, bounds: tuple[int, ...], c: float) -> float:
        """1F1B bottleneck of a split when each boundary costs c seconds."""
        edges = (0, *bounds, self.L)
        P = len(edges) - 1
        return max(costs.compute(edges[s], edges[s + 1] - 1) + 2 * c * ((s > 0) + (s < P - 1)) for s in range(P))

    def _offer(self, cand: Candidate, best: list, front: list, top: int, pareto: bool) -> None:
        entry = (-cand.score, self.evaluated, cand)
        if len(best) < top:
            heapq.heappush(best, entry)
        elif cand.score < -best[0][0]:
            heapq.heapreplace(best, entry)
        if pareto:
            o = cand.outcome
            if any(f.outcome.iteration_time_s <= o.iteration_time_s and
                   f.outcome.cost_per_iteration_usd <= o.cost_per_iteration_usd for f in front):
                return
            front[:] = [f for f in front if not (o.iteration_time_s <= f.outcome.iteration_time_s and
                                                 o.cost_per_iteration_usd <= f.outcome.cost_per_iteration_usd)]
            front.append(cand)

    def _materialize(self, c: Candidate) -> tuple[Plan, Estimate]:
        plan = self._design(c.design).to_plan(self.model.name, self.L, self.gbs, self.runtime)
        est = self.sim.simulate(plan, self.rt)
        if not est.fits_in_memory or not math.isclose(est.iteration_time_s, c.outcome.iteration_time_s,
                                                      rel_tol=1e-9):
            raise AssertionError(f"planner and simulator disagree: {c.outcome.iteration_time_s} s vs "
                                 f"{est.iteration_time_s} s, fits {est.fits_in_memory}, for {plan}")
        return plan, est
