"""The planner: co-optimize which GPUs to use and how to parallelize over them.

The search space is in space.py and the three design modules. The search is a
best-first branch and bound: families of configurations (a design kind, its
pools, microbatch size, TP degrees and stage counts) carry a lower bound of
their objective and expand, in bound order, into configurations (one per
distinct per-pipeline microbatch count m, with the fewest pipelines D giving
it: more replicas only add sync time, GPUs and egress), then into a tighter
bound (with the gradient sync of an average stage), then into exact
evaluations over the split frontier. The search stops once a bound cannot beat
the K-th best plan found, so the result is the optimum of the space under the
simulator's model. Every returned plan is re-simulated: its time and cost must
agree with the search's to 1e-9 and it must keep every limit the user gave
(verify.py); tests/planner/test_search.py compares with brute force on small
clusters. Before the first pass queues chains and two-type families, a probe (a best-first
search over single-pool designs alone, until its first plan) gives a score the optimum cannot
exceed, so what is bounded above it is dropped when queued (`_probe`). The
plans found are then tried with their replicas stage by stage over their zones
(several chains side by side, arrange.py): a pass outside the exact search,
judged by the simulator, that only ever replaces a plan by a better one.

Activation recomputation (`recompute`): "never", "always" (every stage
recomputes), or "auto": a second pass over the same space with recomputation,
which starts from the first pass's best plans as its cutoff. In that pass a
stage recomputes only if it does not fit without (per-stage recomputation, in
the split search: partition.SplitTable, the chains' segments, and
partition.JointSplitTable for two types side by side, where a stage recomputes
on both types unless both fit it without). A plan of that pass can only beat
the first pass's if one of its stages does not fit without recomputing (else
the same plan without it is faster), so that stage's time bounds the family's
bottleneck from below (`_recompute_floor`), and families without such a stage
are skipped.

With the distributed optimizer (`distributed_optimizer`) every stage's D replicas split its
optimizer state and step, so what fits depends on D: the exact evaluations take the stage
facts of their own D (StageCosts.sharded), the optimizer step in a bound is divided by the
most pipelines its family can have, and whether a stage must recompute is judged at D = 1
(needs it) against D = inf (fits with it), so every bound holds for every D.
"""
from __future__ import annotations

import gc
import heapq
import itertools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from planner.errors import SailorError
from planner.profiles.profile import Profile
from planner.search.arrange import rearrange
from planner.search.chains import TYPE_CHAIN_GPUS, Chains
from planner.search.goal import Goal, Outcome
from planner.search.partition import StageCosts
from planner.search.single_pool import SinglePool
from planner.search.space import ClassDesign, Design, Segment, Shape, edge_ends, ring_edge_counts, ring_edges_of, spread
from planner.search.two_types import TwoTypes
from planner.search.verify import check_promises
from planner.simulator.network import Endpoint
from planner.simulator.runtime_model import RuntimeModel, runtime_model
from planner.simulator.simulate import GRAD_BYTES, Estimate, Simulator
from planner.specs.plan import Plan, with_model

GROUP, FAMILY, CONFIG, RESUME, EVALUATE = 0, 1, 2, 3, 4  # what a queue entry asks for
PROBE_MARGIN = 1e-12  # relative: the probe's cut lies this far above its plan's score (_probe)
RECOMPUTE_MODES = {"never": (False,), "always": (True,), "auto": (False, True)}  # the passes of each mode
TYPE_CHAIN_MODES = ("auto", "always")  # type chains on small clusters or where nothing else fits; on any cluster


@dataclass(frozen=True)
class Candidate:
    """A plan the search found, kept as its design (built into a Plan only if it stays in the top K)."""

    score: float
    outcome: Outcome
    design: tuple  # arguments of Planner._design
    recompute: bool | str = False  # every stage recomputes; "per stage": those that do not fit without


@dataclass
class Result:
    """What a search returns: the best plans with their estimates, and how the search went."""

    plans: list[tuple[Plan, Estimate]]  # best first
    search_time_s: float
    evaluated: int
    pareto: list[tuple[Plan, Estimate]] = field(default_factory=list)
    not_searched: list[str] = field(default_factory=list)  # designs left out, and how to search them


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector paused: the search allocates millions of short-lived tuples
    and lists (and reading profiles a JSON tree per file), which its passes would scan again and
    again for cycles they do not form. Cycles made meanwhile are collected afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Planner(SinglePool, Chains, TwoTypes):
    def __init__(self, sim: Simulator, global_batch: int, goal: Goal, runtime: str = "sailor",
                 max_stages: int | None = None, microbatch_sizes: list[int] | None = None, two_pools: bool = True,
                 two_classes: bool = True, max_tp: int | None = None, recompute: str = "auto",
                 arrange: bool = True, distributed_optimizer: bool = False, type_chains: str = "auto",
                 deep_chains: bool = True):
        if global_batch < 1:
            raise SailorError("--global-batch must be positive")
        none = "no GPUs to plan on: give --gpus TYPE@ZONE=COUNT,... or a cluster file with 'available'"
        if not sim.cluster.available:
            raise SailorError(none)
        self.sim, self.gbs, self.goal = sim, global_batch, goal
        self.rt: RuntimeModel = runtime_model(runtime)
        self.runtime = runtime
        if distributed_optimizer and not self.rt.sharded_state_bytes:
            raise SailorError(f"the distributed optimizer is sailor's runtime's, not {runtime}'s; drop "
                              "--use-distributed-optimizer or plan for --runtime sailor")
        self.distributed_optimizer = distributed_optimizer  # plans split their optimizer state (ZeRO-1)
        self.model = sim.model
        self.L = self.model.num_layers
        by_zone: dict[str, int] = {}
        for pool in sim.cluster.available:
            by_zone[pool.zone] = by_zone.get(pool.zone, 0) + pool.count
        quotas = sim.cluster.quotas
        gpus = sum(min(n, quotas.get(z, n)) for z, n in by_zone.items())
        if not gpus:
            limited = ", ".join(f"{z}: {quotas[z]}" for z in by_zone if z in quotas)
            raise SailorError(f"the zone quotas leave no GPUs to plan on ({limited}); raise them under 'quotas:' in "
                              "the cluster file, or drop them" if limited else none)
        # a stage takes a GPU at least: no more stages than GPUs (split tables grow with the stage count)
        if goal.max_gpus is not None:
            gpus = min(gpus, goal.max_gpus)
        self.max_stages = max(1, min(max_stages or self.L, self.L, gpus))
        self.mbs_filter = set(microbatch_sizes) if microbatch_sizes else None
        self.max_tp = max_tp  # e.g. what an elastic job's vocabulary padding allows
        self.two_pools = two_pools  # also search designs that chain pools (types or zones) in a pipeline
        self.two_classes = two_classes  # also search plans with pipelines of two GPU types
        self.arrange = arrange  # also try the best plans' replicas stage by stage over their zones (arrange.py)
        if recompute not in RECOMPUTE_MODES:
            raise SailorError(f"unknown recompute mode {recompute!r}: use one of {', '.join(RECOMPUTE_MODES)}")
        self.recompute = recompute
        if type_chains not in TYPE_CHAIN_MODES:
            raise SailorError(f"unknown type-chain mode {type_chains!r}: use one of {', '.join(TYPE_CHAIN_MODES)}")
        self.type_chains = type_chains
        self._pass_recomputes = False  # the pass running now
        self._type_chain_pass = False  # the passes that add type chains (run(): where nothing else fits)
        self.deep_chains = deep_chains  # where nothing fits, chains with any number of stages on every pool
        self._any_head = False  # the pass that lets a chain's first pools take any number of stages (run())
        self.evaluated = 0
        self._sync_cache: dict = {}
        self._cutoff = math.inf  # what a bound must beat: the K-th best score found, or the probe's
        self._front: list = []  # the Pareto front found so far (empty but in a Pareto search)
        self._by_time = goal.objective == "throughput"  # bounds are seconds (else USD per iteration): run()
        self._probe_cut = math.inf  # just above the score of the probe's plan (_probe)
        self._ring_cache: dict = {}  # (gpu, tp, placed, replicas per node) -> the ring's distinct edges
        self._ring_peaks: dict = {}  # the same -> (least peak rate, largest latency) of its edges
        self._kind_peaks: dict = {}  # (gpu, tp, kinds of edge) -> the same: rings of other counts share it
        self._front_cache: dict = {}

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

    def shapes(self, recompute: bool = False) -> list[Shape]:
        """Every (GPU type, microbatch size, TP) that can run, with every stage recomputing or none."""
        sim, out = self.sim, []
        for gpu in sorted({p.gpu for p in sim.cluster.available}):
            zones = self._zones(gpu)
            if not zones:
                continue
            spec = sim.cluster.gpu(gpu)
            if sim.precision == "bf16" and not spec.bf16:
                continue  # e.g. V100s in a bf16 plan (the default picks fp16 where such GPUs are offered)
            profile: Profile = sim.profile(gpu)
            prices = {z: sim.cluster.price_per_hour(gpu, z, sim.cluster.is_spot(gpu, z)) / 3600 for z, _ in zones}
            for mbs in profile.microbatch_sizes():
                if self.gbs % mbs or (self.mbs_filter and mbs not in self.mbs_filter):
                    continue
                for tp in profile.tp_degrees():
                    if tp > min(spec.gpus_per_node, self.max_tp or tp) or (mbs, tp) not in profile.times \
                            or tp not in profile.memory or tp & (tp - 1):  # runtimes split by powers of two
                        continue
                    costs = self._stage_costs(gpu, mbs, tp, recompute)
                    plain = self._stage_costs(gpu, mbs, tp, False) if recompute and self.recompute == "auto" else None
                    comm = {(z, same): self._boundary(gpu, z, tp, mbs, profile, same)
                            for z, _ in zones for same in (True, False)}
                    out.append(Shape(gpu, mbs, tp, spec.gpus_per_node, zones, costs, comm,
                                     profile.optimizer_s_per_param / tp, prices, plain))
        return out

    def _recompute_floor(self, shape: Shape, inflight: range) -> float:
        """Auto mode, recomputing shape: the least seconds (F+B of one microbatch) of a stage with
        one of these in-flight counts that fits only when recomputing; inf if there is none (the
        family is not worth searching). 0 for shapes that do not recompute in auto mode."""
        if shape.plain is None:
            return 0.0
        return min((self._least_needed_stage(shape, f) for f in inflight), default=math.inf)

    def _recompute_floor_upto(self, shape: Shape, most: int | None = None) -> float:
        """_recompute_floor over in-flight counts 1..most (default: any), from below and cheaply:
        with `most` in flight stages need recomputing soonest, so the shortest stage from each
        layer that does not fit without it then bounds those that need it at any smaller count
        (whether they fit with it or not)."""
        if shape.plain is None:
            return 0.0
        top = min(self.max_stages, self.gbs // shape.mbs)
        f = min(most or top, top)
        floors = shape.tables.setdefault("floors", [None] * (top + 1))
        if floors[f] is None:
            floors[f] = self._least_over_needed(shape, f, shape.costs.compute)
        return floors[f]

    def _least_over_needed(self, shape: Shape, inflight: int, of) -> float:
        """min of of(first, last) over the shortest stage from each layer that does not fit without
        recomputing with `inflight` microbatches in flight (inf: none)."""
        reach = shape.plain.last_fit(inflight)
        return min((of(j, r + 1) for j, r in enumerate(reach) if r + 1 < self.L), default=math.inf)

    def _least_needed_stage(self, shape: Shape, inflight: int) -> float:
        key = ("needed", inflight)
        if key not in shape.tables:
            # with the distributed optimizer, any replica count: a stage needs recomputing with one replica
            # at most (the most memory per GPU), fits with it with infinitely many at least
            plain, least = shape.plain.last_fit(inflight), math.inf
            recomputed = shape.costs.sharded(math.inf).last_fit(inflight)
            for j in range(self.L):
                i = plain[j] + 1  # the shortest stage from layer j that needs recomputing...
                if i <= recomputed[j]:  # ...and fits with it; longer ones take longer
                    least = min(least, shape.costs.compute(j, i))
            shape.tables[key] = least
        return shape.tables[key]

    def _stage_costs(self, gpu: str, mbs: int, tp: int, recompute: bool) -> StageCosts:
        sim, spec = self.sim, self.sim.cluster.gpu(gpu)
        mem = sim.layer_memory(gpu, tp, recompute)
        return StageCosts(sim.layer_times(gpu, mbs, tp, recompute), mem, sim.profile(gpu).layer_memory(1), mbs=mbs,
                          state_bytes=self.rt.state_bytes(sim.precision), allocator=self.rt.allocator_factor,
                          optimizer_step_bytes=self.rt.optimizer_step_bytes,
                          sharded_bytes=self.rt.sharded_state_bytes if self.distributed_optimizer else 0.0,
                          overhead=spec.runtime_overhead_bytes, capacity=spec.memory_bytes,
                          tied_params=mem.params[0] if self.model.tied_embeddings else 0)

    def _boundary(self, gpu: str, zone: str, tp: int, mbs: int, profile: Profile, same_node: bool) -> float:
        """p2p seconds of one stage boundary in `zone` (every boundary carries one h-sized activation)."""
        x = mbs * profile.layer_memory(1).output_bytes[1]
        links = tp if self.rt.p2p_split_over_tp else 1
        return self.sim.network.p2p_time(x, Endpoint(gpu, zone, 0, links),
                                         Endpoint(gpu, zone, 0 if same_node else 1, links))

    def run(self, top: int = 1, pareto: bool = False) -> Result:
        """The best plans (see _run), with Python's cyclic garbage collector paused (gc_paused)."""
        with gc_paused():
            return self._run(top, pareto)

    def _run(self, top: int, pareto: bool) -> Result:
        """Best-first branch and bound over families of configurations.

        A family (shape and stage count; or two pools, TP degrees and stage
        counts) expands into one configuration per distinct microbatch count;
        both carry a lower bound of their objective. Popping in bound order,
        the search stops once a bound cannot beat the K-th best plan found.
        """
        t0 = time.process_time()
        # A Pareto front does not depend on the objective, so a Pareto search bounds time and searches
        # the whole space (two GPU types side by side too, which cannot be the cheapest plan but can be
        # on the front); the K best plans are still the objective's.
        self._by_time = pareto or self.goal.objective == "throughput"
        best: list = []  # heap of (-score, seq, candidate): the K best so far
        front: list[Candidate] = []
        searched = []  # every pass's shapes stay alive: caches are keyed by id() of their costs
        self._probe_cut = math.inf
        # pipelines through three pools of two or three GPU types (chains.py): on small clusters, else where
        # nothing else fits
        gpus = sum(p.count for p in self.sim.cluster.available)
        small = gpus <= TYPE_CHAIN_GPUS or self.type_chains == "always"
        for self._type_chain_pass in (small, True):
            for recompute in RECOMPUTE_MODES[self.recompute]:  # later passes start with the plans found so far
                self._pass_recomputes = recompute
                searched.append(self.shapes(recompute))
                self._search(searched[-1], best, front, top, pareto)
            if best or small or not self.two_pools:
                break
        if not best and self.two_pools and self.deep_chains and self._fits_nowhere():
            # chains may put any number of stages on every pool, not only on the last: FIRST_POOL_STAGES keeps
            # the search fast where plans exist, but a large model on small GPUs may fit only across two deep
            # pools
            self._any_head = self._type_chain_pass = True
            for recompute in RECOMPUTE_MODES[self.recompute]:
                self._pass_recomputes = recompute
                searched.append(self.shapes(recompute))
                self._search(searched[-1], best, front, top, pareto)
        not_searched = []
        places = {(sh.gpu, z) for shapes in searched for sh in shapes for z, _ in sh.zones}  # (what can run)
        if not self._type_chain_pass and self.two_pools and self._type_chain_places(places):
            not_searched.append(f"pipelines through three pools (type@zone) of several GPU types, above "
                                f"{TYPE_CHAIN_GPUS} GPUs ({gpus} here) searched only where nothing else fits: "
                                "--type-chains always searches them (slower)")
        ranked = sorted((entry[2] for entry in best), key=lambda c: c.score)
        plans = [self._materialize(c) for c in ranked]
        if self.arrange:  # several chains side by side, where the simulator finds them faster or cheaper
            arranged = [rearrange(p, e, self.sim, self.rt, self.goal) for p, e in plans]
            plans = sorted((pe for i, pe in enumerate(arranged) if all(pe[0] != q for q, _ in arranged[:i])),
                           key=lambda pe: self.goal.score_estimate(pe[1]))
        frontier = [self._materialize(c) for c in sorted(front, key=lambda c: c.outcome.iteration_time_s)]
        return Result(plans, time.process_time() - t0, self.evaluated, frontier, not_searched)

    def again(self, goal: Goal, **changes) -> "Planner":
        """The same search with another goal (and any other setting changed)."""
        kw = dict(runtime=self.runtime, max_stages=self.max_stages,
                  microbatch_sizes=sorted(self.mbs_filter) if self.mbs_filter else None,
                  two_pools=self.two_pools, two_classes=self.two_classes, max_tp=self.max_tp,
                  recompute=self.recompute, arrange=self.arrange, distributed_optimizer=self.distributed_optimizer,
                  type_chains=self.type_chains, deep_chains=self.deep_chains)
        return type(self)(self.sim, self.gbs, goal, **{**kw, **changes})

    def _fits_nowhere(self) -> bool:
        """No plan fits the GPUs, whatever the goal's limits: run() found none and the goal has no limits,
        or a search without them (and without this last pass) finds none either."""
        free = Goal(self.goal.objective)
        return self.goal == free or not self.again(free, deep_chains=False, arrange=False).run(top=1).plans

    def _probe(self, shapes: list[Shape], singles: list) -> float:
        """Just above the score of the first plan that a best-first search over single-pool designs
        alone finds (inf: none), found before the chains are expanded. The optimum is at most that
        score, so what is bounded above it cannot be the best plan, and the search drops it when it
        queues it. Everything bounded at or below it is searched as before, in the same order, so
        ties still go to the plan found first. The probe's plan is not offered: the search finds it
        again (its work is cached), so "just above" is a relative 1e-12: the sum that bounds it may
        round a few units in the last place above its score (t_lb·usd + sync·usd against
        (t_lb + sync)·usd), and it must not be dropped for that."""
        probe: list = []
        evaluated = self.evaluated
        self._search(shapes, probe, [], 1, False, singles)
        self.evaluated = evaluated
        return -probe[0][0] + abs(probe[0][0]) * PROBE_MARGIN if probe else math.inf

    def _search(self, shapes: list[Shape], best: list, front: list, top: int, pareto: bool,
                probe: list | None = None) -> None:
        """probe: these single-pool families alone, until the first plan is found (_probe)."""
        queue: list = []  # (bound, seq, step, function, args)
        seq = itertools.count()
        singles = probe if probe is not None else \
            [fam for shape in shapes for P in range(1, min(self.max_stages, sum(c for _, c in shape.zones) // shape.tp)
                                                    + 1) if (fam := self._single_family(shape, P)) is not None]
        if probe is None and top == 1 and not pareto and self._probe_cut == math.inf:
            self._probe_cut = self._probe(shapes, singles)
        bar = math.inf if probe is not None else self._probe_cut
        self._front = front  # (a Pareto search also drops what its front beats: chains.py)

        def cutoff() -> float:  # a bound at or past it cannot give the best plan(s)
            return min(bar, -best[0][0]) if len(best) == top and not pareto else bar

        self._cutoff = cutoff()
        for fam in singles:
            if fam[0] < self._cutoff:
                heapq.heappush(queue, (fam[0], next(seq), FAMILY, self._single_configs, fam[1]))
        for mbs in self._chain_pools(shapes) if self.two_pools and probe is None else ():
            for bound, entry in self._chain_starts(mbs):
                if bound < self._cutoff:
                    heapq.heappush(queue, (bound, next(seq), GROUP, self._chain_expand, entry))
        # pipelines of two types side by side: for throughput and Pareto fronts (for cost, the cheaper type
        # per microbatch alone is as cheap up to fill and sync; see docs/planner.md)
        classes = self.two_classes and self._by_time and probe is None
        for x, y, orders in self._class_pairs(shapes) if classes else ():
            if max(x.costs.compute(0, self.L - 1), y.costs.compute(0, self.L - 1)) >= self._cutoff:
                continue  # every family's time holds a whole microbatch's F+B on each type (_two_class_family)
            for P in range(1, self.max_stages + 1):
                fam = self._two_class_family(x, y, P, self._cutoff)
                if fam is not None and fam[0] < self._cutoff:
                    for xo, yo in orders:  # (the family's bound does not depend on the zones' order)
                        heapq.heappush(queue, (fam[0], next(seq), FAMILY, self._two_class_configs,
                                               (xo, yo, *fam[1][2:])))
        while queue:
            bound, _, step, fn, args = heapq.heappop(queue)
            if bound >= cutoff():
                break  # nothing left can enter the top K
            if step == GROUP:  # a chain of pools: expand into its families and into longer chains
                for sub_bound, kind, sub in fn(args, cutoff()):
                    if sub_bound < cutoff():
                        heapq.heappush(queue, (sub_bound, next(seq), *((FAMILY, self._chain_configs, sub) if
                                                                        kind == "family" else (GROUP, fn, sub))))
            elif step == FAMILY:  # expand into configurations, bounded cheaply
                configs = fn(*args)  # throughput bounds grow with m: already in order
                if not self._by_time:
                    configs = iter(sorted(configs, key=lambda c: c[0]))
                nxt = next(configs, None)
                if nxt is not None:
                    heapq.heappush(queue, (nxt[0], next(seq), CONFIG, nxt, configs))
            elif step == CONFIG:  # a configuration: a lower bound of its gradient sync added, queued again;
                _, refine, cfg = fn  # the rest of its family waits behind it
                extra, usd, evaluate, cfg = refine(*cfg)
                # (dropped if it cannot enter the top K, as the cutoff only falls, or a Pareto search's front
                # matches or beats it in time and cost)
                if bound + extra < self._cutoff and bound + extra < self._front_cut(usd):
                    if evaluate is None:  # a cheap floor of the sync: the exact refinement cfg waits behind it
                        heapq.heappush(queue, (bound + extra, next(seq), RESUME, cfg[0], (bound, cfg[1])))
                    else:
                        heapq.heappush(queue, (bound + extra, next(seq), EVALUATE, evaluate, cfg))
                nxt = next(args, None)
                if nxt is not None:
                    heapq.heappush(queue, (nxt[0], next(seq), CONFIG, nxt, args))
            elif step == RESUME:  # the exact refinement fn, added to the configuration's own bound
                own, rest = args
                extra, usd, evaluate, cfg = fn(*rest)
                if own + extra >= self._front_cut(usd):
                    continue
                heapq.heappush(queue, (own + extra, next(seq), EVALUATE, evaluate, cfg))
            else:
                fn(*args, best, front, top, pareto)
                if probe is not None and best:
                    return

    def _bound(self, t_lb: float, usd_per_s: float) -> float:
        return t_lb if self._by_time else t_lb * usd_per_s

    def _could_admit(self, t_lb: float, usd_per_s: float) -> bool:
        """False if lower bounds of time and price already break a limit of the goal."""
        g = self.goal
        return not ((g.min_throughput and t_lb * g.min_throughput > 1 + 1e-12)
                    or (g.max_cost_per_iteration and t_lb * usd_per_s > g.max_cost_per_iteration)
                    or (g.max_cost_per_hour and usd_per_s * 3600 > g.max_cost_per_hour))

    def _microbatch_counts(self, M: int, d_cap: int):
        """(m, D), m growing and D falling: for every distinct pipeline count D = ceil(M/m), the smallest
        m giving it (the most microbatches a pipeline runs). Steps from one D to the next, so a batch of
        millions of microbatches takes O(sqrt(M)) steps, not M. With the distributed optimizer every D
        up to d_cap: more pipelines at the same m split each stage's optimizer state and step more
        ways, so they may fit where fewer do not, or step faster."""
        if self.distributed_optimizer:
            for D in range(min(d_cap, M), 0, -1):
                yield -(-M // D), D
            return
        m = math.ceil(M / d_cap)
        while m <= M:
            D = math.ceil(M / m)
            yield m, D
            if D == 1:
                return
            m = math.ceil(M / (D - 1))  # the first m whose pipeline count is below D

    def _sync(self, params: int, D: int, gpu: str, tp: int, placed: tuple, per_node_replicas: int) -> tuple:
        """(seconds, egress USD) of one stage's gradient ring; cached, the search asks again and again."""
        key = (params, D, gpu, tp, placed, per_node_replicas)
        if key not in self._sync_cache:
            if D > 1:
                self._sync_cache[key] = self.sim.edges_sync(params, D, self._ring_edges(gpu, tp, placed,
                                                                                      per_node_replicas))
            else:
                self._sync_cache[key] = (0.0, 0.0)
        return self._sync_cache[key]

    def _ring_sync_floor(self, params: int, D: int, gpu: str, tp: int, placed: tuple, per_node_replicas: int) -> float:
        """A lower bound of _sync's seconds in O(1) once per ring (_ring_peak), by allreduce_time's formula."""
        rate, lat = self._ring_peak(gpu, tp, placed, per_node_replicas)
        return 2 * (D - 1) / D * (GRAD_BYTES * params) / rate + 2 * (D - 1) * lat

    def _ring_peak(self, gpu: str, tp: int, placed: tuple, per_node_replicas: int) -> tuple[float, float]:
        """(least peak rate, largest latency) of a ring's edges, cached: every edge streams at most at its
        peak (Network.peak_ring_rate), so the slowest peak bounds the slowest edge, and the latency
        term is allreduce_time's own. It reads which kinds of edge the ring has, not how often each
        occurs, so rings of other replica counts share it (4 zones of A100s: 1,346 rings, 81 sets of kinds)."""
        ring = (gpu, tp, placed, per_node_replicas)
        got = self._ring_peaks.get(ring)
        if got is None:
            kinds = (gpu, tp, *ring_edge_counts(placed, per_node_replicas))
            got = self._kind_peaks.get(kinds)
            if got is None:
                rates = [self.sim.network.peak_ring_rate(*edge_ends(gpu, tp, *kind)) for kind in kinds[2:]]
                got = self._kind_peaks[kinds] = (min(r for r, _ in rates), max(lat for _, lat in rates))
            self._ring_peaks[ring] = got
        return got

    def _ring_edges(self, gpu: str, tp: int, placed: tuple, per_node_replicas: int) -> list:
        """A stage's gradient ring's distinct edges (space.ring_edges_of), cached: they do not depend on
        the parameters."""
        ring = (gpu, tp, placed, per_node_replicas)
        edges = self._ring_cache.get(ring)
        if edges is None:
            edges = self._ring_cache[ring] = ring_edges_of(gpu, tp, list(placed), per_node_replicas)
        return edges

    def _shards(self, D: int) -> int:
        """Ways each stage of D replicas splits its optimizer state and step (Simulator.optimizer_shards)."""
        return D if self.distributed_optimizer else 1

    @staticmethod
    def _per_node(shape: Shape, stages: int) -> int:
        """Replicas of one stage that share a node under the placement rule."""
        need = stages * shape.tp
        return shape.per_node // need if need <= shape.per_node else shape.per_node // shape.tp

    def _consider(self, outcome: Outcome, design: tuple, best, front, top, pareto, recompute=None) -> None:
        """`design` = (mbs, segments as (gpu, tp, stages, zone or zones), bounds, D): built only if kept.
        recompute: the candidate's, if not the pass's (Candidate.recompute)."""
        self.evaluated += 1
        if self.goal.admits(outcome):
            rc = self._pass_recomputes if recompute is None else recompute
            self._offer(Candidate(self.goal.score(outcome), outcome, design, rc), best, front, top, pareto)

    def _design(self, args: tuple) -> Design:
        if args[0] == "classes":
            return ClassDesign(*args[1:])
        mbs, segments, bounds, D = args
        segs = tuple(Segment(g, tp, n, (zones,) * D if isinstance(zones, str) else zones)
                     for g, tp, n, zones in segments)
        return Design(mbs, segs, bounds, spread(self.gbs // mbs, D))

    def _offer(self, cand: Candidate, best: list, front: list, top: int, pareto: bool) -> None:
        entry = (-cand.score, self.evaluated, cand)
        if len(best) < top:
            heapq.heappush(best, entry)
        elif cand.score < -best[0][0]:
            heapq.heapreplace(best, entry)
        if len(best) == top and not pareto:
            self._cutoff = min(self._cutoff, -best[0][0])  # what a bound must beat now
        if pareto:
            o = cand.outcome
            if any(f.outcome.iteration_time_s <= o.iteration_time_s and
                   f.outcome.cost_per_iteration_usd <= o.cost_per_iteration_usd for f in front):
                return
            front[:] = [f for f in front if not (o.iteration_time_s <= f.outcome.iteration_time_s and
                                                 o.cost_per_iteration_usd <= f.outcome.cost_per_iteration_usd)]
            front.append(cand)

    def _materialize(self, c: Candidate) -> tuple[Plan, Estimate]:
        """The plan of a candidate, simulated again and held to every promise (verify.py)."""
        plan = with_model(self._design(c.design).to_plan(self.model.name, self.L, self.gbs, self.runtime), self.model)
        plan = replace(plan, precision=self.sim.precision, distributed_optimizer=self.distributed_optimizer)
        if c.recompute == "per stage":  # the stages that do not fit without recomputing (as the search chose)
            fits = [self.sim.stage_fits(plan, s, self.rt) for s in range(plan.pp)]
            plan = replace(plan, stages=tuple(replace(s, recompute=not ok) for s, ok in zip(plan.stages, fits)))
        elif c.recompute:
            plan = replace(plan, stages=tuple(replace(s, recompute=True) for s in plan.stages))
        est = self.sim.simulate(plan, self.rt)
        check_promises(plan, est, self.goal, self.sim.cluster, c.outcome)
        return plan, est
