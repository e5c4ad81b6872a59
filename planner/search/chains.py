"""Designs on chains of pools: the first stages on pool 1, the next on pool 2, ..., the last on pool k.

A pool is one GPU type in one zone, with its own TP degree; a chain holds k >= 2
distinct pools with one microbatch size, and all D pipelines are alike, so
every stage's gradient ring stays inside one pool's zone while a pipeline
crosses k - 1 pool boundaries. Every pool but the last holds up to
FIRST_POOL_STAGES stages (four before another type: cheap or memory-light GPUs
for the embedding end; two before the same type in another zone), the last
pool the rest; where nothing fits within those limits, Planner.run's last pass
lifts them (_stage_limit). Chains are
  * of two pools: any two (GPU type, zone) pools, each with its own TP degree;
  * zone chains: one GPU type and TP degree over its first k >= 3 zones in the
    fill order of single_pool.py (cheapest, fastest network, largest);
  * type chains: TYPE_CHAIN_LENGTH distinct pools of at least two GPU types, in
    any order, each with its own zone and TP degree (three types; or one type
    in two zones and another: A100s in two zones with V100s in a third), on
    clusters of at most TYPE_CHAIN_POOLS (type, zone) pools. On clusters
    of at most TYPE_CHAIN_GPUS GPUs (or with type_chains="always") they are
    searched with the other designs; on larger ones only where no design of the
    other kinds fits (Planner.run searches again with them), as their bounds
    prune little there.
For a design the simulator's time is

    T = sum_i compute_i + 2 (sum of boundary p2p) + (m - 1) max_s slot_s
        + max_i sync_i(G_i, D) + max_i u_i G_i

with G_i the largest stage of pool i. Each pool's segment has an exact
(slot, params) frontier for every first and last layer (`_segment`); the
evaluation goes over the pools left to right, keeping at each pool boundary
the partial splits no other beats in compute, slot, sync, update and egress.
In auto mode's recomputing pass a stage recomputes only if it does not fit
without (per-stage recomputation: a segment's frontier then also keeps the F+B
its recomputing stages add), and the bounds take every layer's time without
recomputing (`_fb`), plus the least that a stage which must recompute adds
(`_least_extra`).

The search reaches chains best-first through bounds that hold for everything
below them: a pair of shapes (GPU type, microbatch size, TP) bounds its chains
of two pools in any zones, so pools are only paired where that could beat the
best plan found; a zone chain bounds itself and its longer versions. Chains of
two pools that differ only by a permutation of interchangeable zones (one
region, the same GPUs, prices, links and egress) are searched once. A type
chain grows one pool at a time from its first; each prefix bounds every chain
of three or more pools that starts with it (_extension_bound). Where a chain's
pools differ in GPU type, its families' bottleneck bound spreads the work by
their speed and memory (_spread_bound), and its configurations' refinement
bounds the gradient sync over every split (_sync_floor). The gradient sync
bounds the search early too: a family's bound adds the sync that the fewest
pipelines that could still beat the cutoff must do (_sync_tail), a chain whose
families would all reach the cutoff that way is dropped before they are
enumerated (_synced_past), and a configuration's sync floor is added before its
split DP.
"""
from __future__ import annotations

import math
from dataclasses import replace
from itertools import accumulate, product

from planner.search.goal import Outcome
from planner.search.partition import pareto as pareto_front
from planner.search.partition import pareto_extra
from planner.search.space import FIRST_POOL_STAGES, Shape, capacity, spread, zone_classes
from planner.simulator.network import Endpoint
from planner.simulator.simulate import GRAD_BYTES

TYPE_CHAIN_POOLS = 6  # type chains are searched where the cluster has at most this many (type, zone) pools
TYPE_CHAIN_LENGTH = 3  # ... and have this many pools
TYPE_CHAIN_GPUS = 32  # ... alongside the other designs on clusters of at most this many GPUs, else where none fits


class Chains:
    """Methods of Planner; see planner.py for the search loop that calls them."""

    # -- which chains -------------------------------------------------------
    def _chain_pools(self, shapes: list[Shape]) -> dict[int, list[Shape]]:
        """Pool shapes (one zone each) by microbatch size; sorts zones into classes of interchangeable ones."""
        self._zone_chains: list[tuple[Shape, Shape]] = []  # the first two zones of each shape with 3 or more
        by_mbs: dict[int, list[Shape]] = {}
        self._next_zone: dict[int, Shape] = {}  # id(pool) -> the pool of its shape in the next zone of the fill order
        self._by_shape: dict[int, list[list[Shape]]] = {}  # mbs -> the pools of each shape
        for sh in shapes:
            pools = [replace(sh, zones=[zone], tables=sh.tables) for zone in sh.zones]
            by_mbs.setdefault(sh.mbs, []).extend(pools)
            self._by_shape.setdefault(sh.mbs, []).append(pools)
            for a, b in zip(pools, pools[1:]):
                self._next_zone[id(a)] = b
            if len(pools) > 2:
                self._zone_chains.append((pools[0], pools[1]))
        self._by_mbs = by_mbs
        # zone -> (its class of interchangeable zones, its rank there): chains are canonical up to swaps inside a class
        classes = zone_classes(self.sim.cluster, self.sim.network.fits.inter,
                               sorted({p.zones[0][0] for pools in by_mbs.values() for p in pools}))
        self._zone_rank = {z: (c[0], r) for c in classes for r, z in enumerate(c)}
        self._fastest: dict[int, tuple] = {}  # mbs -> prefix sums of each layer's least F+B over its pools
        for mbs, pools in by_mbs.items():
            prefix = [0.0]
            for j in range(self.L):
                prefix.append(prefix[-1] + min(_fb(p)[j + 1] - _fb(p)[j] for p in pools))
            self._fastest[mbs] = tuple(prefix)
        places = {(p.gpu, p.zones[0][0]) for pools in by_mbs.values() for p in pools}
        self._type_chains = self._type_chain_pass and self._type_chain_places(places)
        return by_mbs

    @staticmethod
    def _type_chain_places(places: set[tuple[str, str]]) -> bool:
        """Whether (GPU type, zone) pools admit type chains: three to TYPE_CHAIN_POOLS, two types at least."""
        return TYPE_CHAIN_LENGTH <= len(places) <= TYPE_CHAIN_POOLS and len({g for g, _ in places}) >= 2

    def _chain_starts(self, mbs: int):
        """(bound, (kind, what)) of every pair of shapes (kind "pairs": their chains of two pools, any
        zones) and of each shape's zone chain (kind "grow": its first two zones in fill order)."""
        shapes = [pools for pools in self._by_shape[mbs] if pools]
        needs = {id(pools): self._recompute_floor_upto(pools[0]) < math.inf for pools in shapes}  # auto's pass 2
        for pa in shapes:
            for pb in shapes:
                if (pa is pb and len(pa) < 2) or not (needs[id(pa)] or needs[id(pb)]):
                    continue  # (recomputing, every stage fits without: the plain chain is as good)
                # any chain of a pool of A then one of B: the largest pools, p2p of at least 0
                rep = (max(pa, key=lambda p: p.zones[0][1]), max(pb, key=lambda p: p.zones[0][1]))
                if self._pair_floor(rep) >= self._cutoff:
                    continue  # (its bound would be at least as large)
                bound = self._chain_bound(rep, False, cross=0.0)
                if bound < math.inf:
                    yield bound, ("pairs", (pa, pb, bound))
        for chain in self._zone_chains:
            if chain[0].mbs == mbs and self._recompute_floor_upto(chain[0]) < math.inf:
                bound = self._chain_bound(chain, True)
                if bound < math.inf:
                    yield bound, ("grow", chain)
        places = {(p.gpu, p.zones[0][0]) for p in self._by_mbs[mbs]}
        if self._type_chains and self._type_chain_places(places) and \
                any(needs[id(pools)] for pools in shapes):  # (recomputing: some stage must need it)
            for a in self._by_mbs[mbs]:
                if self._canonical((), a):
                    bound = self._extension_bound((a,))
                    if bound < self._cutoff:
                        yield bound, ("extend", (a,))

    def _pair_floor(self, rep: tuple) -> float:
        """Throughput: a lower bound, in O(L), of the time of every design on the chains of two pools
        that rep bounds (as _chain_bound(rep, cross=0) does, coarser). Each layer at the faster pool's
        time: their sum is at most a microbatch's compute, the largest at most the bottleneck (its
        stage holds it); D <= d_most pipelines, so at least ceil(M / d_most) - 1 bubbles; the bound's
        terms decrease in P, so P = top is the least. A 1e-9 margin for rounding."""
        if not self._by_time or self._cutoff == math.inf:
            return -math.inf
        (a, b), L, M, top = rep, self.L, self.gbs // rep[0].mbs, min(self.max_stages, self.L)
        d_most = min(M, *(n // p.tp for p in rep for _, n in p.zones))
        if d_most < 1:
            return math.inf
        key = ("pair-layers", id(a.plain or a.costs), id(b.plain or b.costs))  # (what _fb reads)
        if key not in self._front_cache:
            fa, fb = _fb(a), _fb(b)
            layers = [min(fa[j + 1] - fa[j], fb[j + 1] - fb[j]) for j in range(L)]
            self._front_cache[key] = (sum(layers), max(layers))
        layers_sum, layers_max = self._front_cache[key]
        total = layers_sum + min(self._least_extra(a), self._least_extra(b))
        u = min(a.u, b.u) * a.costs.params(0, L - 1) / self._shards(d_most)
        return (total + (math.ceil(M / d_most) - 1) * max(total / top, layers_max) + u / top) * (1 - 1e-9)

    def _canonical(self, chain: tuple, nxt: Shape) -> bool:
        """May a chain of two pools start with `chain` and go on to `nxt`? Each (GPU type, zone) once; a
        zone new to the chain is the lowest-ranked of its class not in it yet (of chains that differ by
        a permutation of interchangeable zones, one is searched)."""
        z = nxt.zones[0][0]
        if any(p.gpu == nxt.gpu and p.zones[0][0] == z for p in chain):
            return False
        if any(p.zones[0][0] == z for p in chain):
            return True
        home, rank = self._zone_rank[z]
        return len({p.zones[0][0] for p in chain if self._zone_rank[p.zones[0][0]][0] == home}) == rank

    def _chain_bound(self, chain: tuple, grow: bool, cross: float | None = None, by_time: bool | None = None) -> float:
        """A lower bound of the objective of every design on `chain` (grow: on a zone chain that extends
        it, whose further pools have the same GPU type and TP degree).

        Any pipeline computes at least `least` seconds per microbatch (each pool of the chain holds
        at least one layer, in order) and crosses each pool boundary twice per microbatch. With P
        stages the bottleneck is at least the average stage and the least largest stage of a split
        of the fastest layers (`_minmax_stage`); D pipelines need P_i tp-groups of each pool i, so
        D <= n_i / tp_i and D P <= sum_i n_i / tp_i (this chain only). For cost, every microbatch
        runs `least` seconds on GPUs at the cheapest price. by_time: which of the two (default: the
        objective's).
        """
        by_time = self._by_time if by_time is None else by_time
        if by_time and cross is None:
            cross = sum(self._cross(a, b) for a, b in zip(chain, chain[1:]))
        # chains of other zones often have the same bound: its inputs, as a key (a pool's costs fix its
        # GPU type, TP degree and microbatch size; its zone enters through its GPUs, price and the p2p)
        key = ("chain-bound", grow, by_time, cross, self._any_head,
               *((id(p.costs), p.zones[0][1], p.prices[p.zones[0][0]]) for p in chain))
        got = self._front_cache.get(key)
        if got is None:
            got = self._front_cache[key] = self._chain_bound_of(chain, grow, cross, by_time)
        return got

    def _chain_bound_of(self, chain: tuple, grow: bool, cross: float | None, by_time: bool) -> float:
        """_chain_bound, worked out (cross: given where by_time)."""
        if not by_time:
            return self.gbs // chain[0].mbs * self._least_compute(chain) * min(p.tp * p.prices[p.zones[0][0]]
                                                                                for p in chain)
        least, terms = self._stage_terms(chain, grow)
        spread4, best = least + 4 * cross, math.inf
        for P, _, waits, floor, upd in terms:  # (the loop runs often: written out for speed)
            slot = spread4 / P
            t = waits * (slot if slot >= floor else floor) + upd
            if t < best:
                best = t
        return least + 2 * cross + best

    def _stage_terms(self, chain: tuple, grow: bool) -> tuple:
        """(least, [(P, d, ceil(M/d) - 1, minmax[P], u / P (/ d with the distributed optimizer))]) of
        _chain_bound for every stage count P with d >= 1 pipelines: what does not depend on the zones'
        p2p; cached. d: the most pipelines, d <= n_i / tp_i for each pool and d P <= their sum; for
        this chain (not grow) also what its last pool holds with the stages the others cannot."""
        key = ("stage-terms", grow, self._any_head, *((id(p.costs), p.zones[0][1]) for p in chain))
        got = self._front_cache.get(key)
        if got is None:
            M, top, L = self.gbs // chain[0].mbs, min(self.max_stages, self.L), self.L
            groups = [n // p.tp for p in chain for _, n in p.zones]
            d_most, total = min(M, *groups), sum(groups)
            minmax = self._minmax_stage(chain)
            u = min(p.u for p in chain) * chain[0].costs.params(0, L - 1)
            if not grow:
                lim = sum(self._stage_limit(a, b) for a, b in zip(chain, chain[1:]))
                last = chain[-1]
                caps = self._last_caps(last.zones[0][1], last.per_node, last.tp, lim, top)
            terms = []
            for P in range(len(chain) + grow, top + 1):
                d = d_most if grow else min(d_most, total // P, caps[P])
                if d >= 1:
                    terms.append((P, d, -(-M // d) - 1, minmax[P], u / (P * d if self.distributed_optimizer else P)))
            got = self._front_cache[key] = (self._least_compute(chain), terms)
        return got

    def _last_caps(self, count: int, per_node: int, tp: int, lim: int, top: int) -> tuple:
        """[P]: pipelines the last pool holds when it has P - lim stages (at least one)."""
        key = ("last-caps", count, per_node, tp, lim, top)
        if key not in self._front_cache:
            self._front_cache[key] = (0, *(capacity(count, per_node, max(1, P - lim), tp) for P in range(1, top + 1)))
        return self._front_cache[key]

    def _least_compute(self, chain: tuple) -> float:
        """Least F+B of one microbatch with pool i holding layers q_i..q_{i+1}-1 (each at least one). In
        auto mode's recomputing pass a design can only win if one of its stages must recompute: plus the
        least that such a stage adds (_least_extra)."""
        return self._least_prefix(chain)[self.L] + min(self._least_extra(p) for p in chain)

    def _least_extra(self, p: Shape) -> float:
        """Auto mode, recomputing pass: the least F+B that recomputing adds to a stage of pool p that does
        not fit without (its blocks' second forward; inf: none needs it). 0 in other passes. As in
        _recompute_floor_upto, with the most microbatches in flight the shortest such stage from each
        layer is shortest, and a longer one adds more."""
        if p.plain is None:
            return 0.0
        key = ("least-extra", id(p.costs))
        if key not in self._front_cache:
            self._front_cache[key] = self._least_over_needed(
                p, min(self.max_stages, self.gbs // p.mbs), lambda i, j: p.costs.compute(i, j) - p.plain.compute(i, j))
        return self._front_cache[key]

    def _least_prefix(self, chain: tuple) -> list[float]:
        """[j]: the least F+B of layers 0..j-1 of one microbatch on the chain's pools in order, each
        holding at least one layer."""
        key = ("least", tuple(id(p.costs) for p in chain))  # pools of one shape share their costs
        if key not in self._front_cache:
            L, i = self.L, len(chain) - 1
            # best[j]: layers 0..j-1 on the pools before the last (their own prefix, cached: chains grow)
            best = self._least_prefix(chain[:-1]) if i else [0.0] + [math.inf] * L
            fb, nxt, run = _fb(chain[-1]), [math.inf] * (L + 1), math.inf
            for j in range(i + 1, L + 1):  # the last pool ends at layer j-1: min over its first layer
                run = min(run, best[j - 1] - fb[j - 1])
                nxt[j] = run + fb[j]
            self._front_cache[key] = nxt
        return self._front_cache[key]

    def _extension_bound(self, prefix: tuple) -> float:
        """A lower bound of the objective of every type chain (TYPE_CHAIN_LENGTH pools) that starts with
        `prefix`. As _chain_bound, with what the further pools may add at its best: the layers after
        the prefix's at the fastest time any pool of this microbatch size gives them (`_fastest`),
        each further pool at least one layer, p2p of at least the prefix's boundaries, the bottleneck
        at least the least largest stage on those fastest layers, and each further pool at most as
        many tp-groups as the largest pool: D <= n_i / tp_i for each pool, and D P <= their sum."""
        mbs, k, L = prefix[0].mbs, len(prefix), self.L
        M, top, everything = self.gbs // mbs, min(self.max_stages, L), self._by_mbs[mbs]
        best, fast = self._least_prefix(prefix), self._fastest[mbs]
        rest = TYPE_CHAIN_LENGTH - k  # further pools, a layer each at least
        least = min((best[j] + fast[L] - fast[j] for j in range(k, L - rest + 1)), default=math.inf)
        least += min(self._least_extra(p) for p in everything)  # (the chain's pools are among them)
        if least == math.inf:
            return math.inf
        if not self._by_time:
            return M * least * min(p.tp * p.prices[p.zones[0][0]] for p in everything)
        cross = sum(self._cross(a, b) for a, b in zip(prefix, prefix[1:]))
        groups = [n // p.tp for p in prefix for _, n in p.zones]
        d_most = min(M, *groups)
        total = sum(groups) + rest * max(n // p.tp for p in everything for _, n in p.zones)
        key = ("minmax-all", mbs)
        if key not in self._front_cache:
            self._front_cache[key] = self._minmax_stage(tuple(everything))
        minmax, u = self._front_cache[key], min(p.u for p in everything) * prefix[0].costs.params(0, L - 1)
        spread4, t = least + 4 * cross, math.inf
        for P in range(TYPE_CHAIN_LENGTH, top + 1):
            d = min(d_most, total // P)
            if d >= 1:
                t = min(t, (math.ceil(M / d) - 1) * max(spread4 / P, minmax[P]) + u / (P * self._shards(d)))
        return least + 2 * cross + t

    def _chain_expand(self, args: tuple, cutoff: float):
        """(bound, step, args) of what a queue entry of chains holds: a pair of shapes, its chains of two
        pools; a chain, its families; a zone chain to grow, the chain one zone longer (its own
        designs, and those of longer ones)."""
        kind, what = args
        if kind == "pairs":
            pa, pb, floor = what
            # throughput: floor + 2 p2p bounds each chain's own bound from below (floor took the largest
            # pools, so the most pipelines and no larger term of _chain_bound, and no p2p, which every
            # term grows with); a 1e-9 margin for rounding. Cost: prices differ by zone, no such floor.
            lowest = (floor if self._by_time else 0.0) * (1 - 1e-9)
            for a in pa:
                if self._canonical((), a):
                    for b in pb:
                        if self._canonical((a,), b) and (not lowest or lowest + 2 * self._cross(a, b) < cutoff):
                            bound = self._chain_bound((a, b), False)
                            if bound < cutoff:
                                yield bound, "chain", ("chain", (a, b))
        elif kind == "chain":
            if self._front and self._front_beats(what, self._chain_bound(what, False, by_time=True),
                                                 self._chain_bound(what, False, by_time=False)):
                return  # a Pareto search's front matches or beats every design of the chain
            if self._synced_past(what, cutoff):
                return  # every family's bound with its sync tail reaches the cutoff
            for fam in self._chain_families(what, cutoff):
                yield fam[0], "family", fam[1]
        elif kind == "extend":  # a type chain's prefix: its chains one pool longer (or their prefixes)
            types = {p.gpu for p in what}
            whole = len(what) + 1 == TYPE_CHAIN_LENGTH
            for c in self._by_mbs[what[0].mbs]:
                # a pool not in the chain yet; the whole chain of two types at least (one type: zone chains)
                if self._canonical(what, c) and not (whole and types == {c.gpu}):
                    ext = (*what, c)
                    bound = self._chain_bound(ext, False) if whole else self._extension_bound(ext)
                    if bound < cutoff:
                        yield bound, "chain", ("chain" if whole else "extend", ext)
        else:
            nxt = self._next_zone.get(id(what[-1]))
            if nxt is not None and len(what) < min(self.max_stages, self.L):
                ext = (*what, nxt)
                for sub, flag in (("chain", False), ("grow", True)):
                    bound = self._chain_bound(ext, flag)
                    if bound < cutoff:
                        yield bound, "chain", (sub, ext)

    def _synced_past(self, chain: tuple, cutoff: float) -> bool:
        """Throughput: whether every family of the chain has a bound at or past `cutoff` once
        _chain_families adds its sync tail, found without the families (most chains the search expands
        yield none, for their sync). With P stages a family's fill is at least F = least + 2 cross, its
        bottleneck at least S = max((least + 4 cross) / P, minmax[P], a stage that must recompute), its
        step at least U = u / P (/ d with the distributed optimizer), and it runs d_cap <= d pipelines
        (as _chain_bound counts them). With one pipeline it has no ring and M microbatches; with more,
        its sync tail is at least the least ring of D_lo replicas over the chain's pools and any
        replicas per node (_least_ring), D_lo taken from the most microbatches that F, S and U let
        beat the cutoff (fewer than the family's own bounds let). The same arithmetic as
        _chain_families, so that a family exactly at the cutoff is judged alike."""
        if not self._by_time or cutoff == math.inf:
            return False
        M = self.gbs // chain[0].mbs
        least, P_terms = self._chain_terms(chain)
        cross = sum(self._cross(a, b) for a, b in zip(chain, chain[1:]))
        F = least + 2 * cross
        for P, floor, d, U, U1 in P_terms:
            S = (least + 4 * cross) / P
            if floor > S:
                S = floor
            if F + (M - 1) * S + U1 < cutoff:
                return False  # (one pipeline: no ring)
            t = F + (-(-M // d) - 1) * S + U
            if t >= cutoff or d < 2:
                continue
            if S <= 0:
                return False  # (no sync tail then)
            steps = (cutoff - F - U) / S
            D_lo = -(-M // (1 + math.floor(steps))) if steps < M else 1
            if D_lo < 2 or t + self._least_ring(chain, P, D_lo) < cutoff:
                return False
        return True

    def _chain_terms(self, chain: tuple) -> tuple:
        """(least, [(P, max(minmax[P], a stage that must recompute), d, U, U1)]) of _synced_past for
        every stage count P of the chain (_stage_terms'): what does not depend on its zones' p2p; cached."""
        key = ("chain-terms", self._any_head, *((id(p.costs), p.zones[0][1]) for p in chain))
        got = self._front_cache.get(key)
        if got is None:
            least, stage_terms = self._stage_terms(chain, False)
            must = min(self._recompute_floor_upto(p) for p in chain)  # 0 unless recomputing
            u = min(p.u for p in chain) * chain[0].costs.params(0, self.L - 1)
            terms = []
            for P, d, _, minmax, _ in stage_terms:
                upd = u / P
                terms.append((P, max(minmax, must), d, upd / d if self.distributed_optimizer else upd, upd))
            got = self._front_cache[key] = (least, terms)
        return got

    def _least_ring(self, chain: tuple, P: int, D: int) -> float:
        """The least sync (a x + b, _ring_line) of a ring of D replicas on any pool of the chain, for a
        stage of the average parameters of P stages, with any number of stages on that pool (so any
        replicas per node): at most _sync_tail's for every split of P stages."""
        avg = -(-chain[0].costs.params(0, self.L - 1) // P)
        best = math.inf
        for p in chain:
            key = ("ring-lines", p.gpu, p.tp, p.zones[0][0], D)
            lines = self._front_cache.get(key)
            if lines is None:
                lines = self._front_cache[key] = [self._ring_line(p, n, D) for n in self._per_node_stages(p)]
            for b, a in lines:
                sync = a * avg + b
                if sync < best:
                    best = sync
        return best

    def _per_node_stages(self, p: Shape) -> tuple:
        """A stage count for each number of replicas per node a pool's stages can have."""
        key = ("per-node-stages", p.per_node, p.tp)
        if key not in self._front_cache:
            stages = {self._per_node(p, n): n for n in range(min(self.max_stages, self.L), 0, -1)}
            self._front_cache[key] = tuple(stages.values())
        return self._front_cache[key]

    # -- families and configurations ------------------------------------------
    def _stage_limit(self, a: Shape, b: Shape) -> int:
        """Stages pool a may take before pool b: FIRST_POOL_STAGES; any number in run()'s last pass."""
        if self._any_head:
            return self.max_stages
        return FIRST_POOL_STAGES["other type" if a.gpu != b.gpu else "other zone"]

    def _chain_families(self, chain: tuple, cutoff: float = math.inf):
        """(bound, args) of every stage-count vector (P_1, ..., P_k) of the chain whose bound is below
        `cutoff`: pools but the last within their limit (FIRST_POOL_STAGES), P <= max_stages."""
        L, M = self.L, self.gbs // chain[0].mbs
        least = self._least_compute(chain)
        params_total = chain[0].costs.params(0, L - 1)
        u = min(p.u for p in chain) * params_total
        crosses = tuple(self._cross(a, b) for a, b in zip(chain, chain[1:]))
        by_time, sharded = self._by_time, self.distributed_optimizer  # (sharded: _shards(d) = d)
        floor = min(self._recompute_floor_upto(p) for p in chain)  # 0 unless recomputing
        quotas, max_gpus = self.sim.cluster.quotas, self.goal.max_gpus
        top = min(self.max_stages, L)
        minmax = self._minmax_stage(chain)
        alike = len({p.gpu for p in chain}) == 1  # one GPU type: the average stage bounds it about as well
        if not alike:
            fastest, slower, excess, most, heaviest = self._speed_ratios(chain)
        # per pool and stage count n: (pipelines it holds, p2p between its stages, GPUs, USD per second)
        facts = [self._pool_facts(p, top) for p in chain]
        last = facts[-1]
        # a pool but the last takes up to its limit, and no more stages than its GPUs hold (capacity falls with n)
        limits = [sum(1 for n in range(1, min(self._stage_limit(a, b), top) + 1) if f[n][0] >= 1)
                  for a, b, f in zip(chain, chain[1:], facts)]
        for head in product(*(range(1, n + 1) for n in limits)):
            if sum(head) >= top:
                continue  # no stage left for the last pool
            h_cap, h_comm, h_gpus, h_usd = M, sum(crosses), 0, 0.0
            for f, n in zip(facts, head):
                cap, c, g, price = f[n]
                h_cap, h_comm, h_gpus, h_usd = min(h_cap, cap), h_comm + (n - 1) * c, h_gpus + g, h_usd + price
            h_P = sum(head)
            for n in range(1, top - h_P + 1):  # (the loop runs often: written out for speed)
                cap, c, g, price = last[n]
                d_cap, comm, P = h_cap if h_cap < cap else cap, h_comm + (n - 1) * c, h_P + n
                if quotas:
                    by_zone: dict[str, int] = {}
                    for p, k in zip(chain, (*head, n)):
                        by_zone[p.zones[0][0]] = by_zone.get(p.zones[0][0], 0) + k * p.tp
                    for z, used in by_zone.items():
                        if z in quotas:
                            d_cap = min(d_cap, quotas[z] // used)
                if max_gpus is not None:
                    d_cap = min(d_cap, max_gpus // (h_gpus + g))
                if d_cap < 1:
                    continue
                fill, upd = least + 2 * comm, u / P  # one replica's step (configurations split it)
                m_min, upd_d = -(-M // d_cap), (upd / d_cap if sharded else upd)
                slot_lb = (least + 4 * comm) / P  # the bottleneck: at least the average stage, floor, minmax[P]
                if floor > slot_lb:
                    slot_lb = floor
                if minmax[P] > slot_lb:
                    slot_lb = minmax[P]
                t_lb = fill + (m_min - 1) * slot_lb + upd_d
                usd = h_usd + price
                bound = t_lb if by_time else _cost_bound(fill, slot_lb, upd_d, usd, M, m_min)
                if bound >= cutoff:
                    continue  # (the bounds below only add to it)
                Ps = (*head, n)
                if not alike:  # a tighter bottleneck bound: pools that differ in speed
                    spread_lb = _spread_bound(fastest, [(k / r, e / r, heaviest[min(k * c, L)])
                                                        for k, r, e, c in zip(Ps, slower, excess, most)])
                    if spread_lb == math.inf:
                        continue  # its pools cannot hold every layer
                    if spread_lb > slot_lb:
                        slot_lb = spread_lb
                        t_lb = fill + (m_min - 1) * slot_lb + upd_d
                        bound = t_lb if by_time else _cost_bound(fill, slot_lb, upd_d, usd, M, m_min)
                if by_time and bound < cutoff and d_cap > 1 and slot_lb > 0:
                    # the configurations that may beat the cutoff have at most 1 + steps microbatches
                    # per pipeline, so at least the pipelines that needs, and their rings (_sync_tail)
                    bound += self._sync_tail(chain, Ps, (cutoff - fill - upd_d) / slot_lb)
                if bound < cutoff and self._could_admit(t_lb, 0.0) and not (self._front and self._front_beats(
                        chain, t_lb, _cost_bound(fill, slot_lb, upd_d, usd, M, m_min) if by_time else bound)):
                    yield bound, (chain, Ps, d_cap, tuple(f[k][1] for f, k in zip(facts, Ps)), crosses, fill,
                                  slot_lb, upd, usd)

    def _pool_facts(self, p: Shape, top: int) -> list:
        """[n]: (pipelines the pool holds, p2p between its stages, GPUs, USD per second) with n stages."""
        key = ("facts", p.gpu, p.mbs, p.tp, p.zones[0], top)
        if key not in self._front_cache:
            z, cnt = p.zones[0]
            self._front_cache[key] = [None] + [(capacity(cnt, p.per_node, n, p.tp),
                                                p.comm[(z, n * p.tp <= p.per_node)] if n > 1 else 0.0,
                                                n * p.tp, n * p.tp * p.prices[z]) for n in range(1, top + 1)]
        return self._front_cache[key]

    def _speed_ratios(self, chain: tuple) -> tuple:
        """Facts of the chain for _spread_bound: (fastest, r, e, c, heaviest). fastest: F+B of one
        microbatch with every layer on its fastest pool of the chain (w*_j for layer j); r_i >= 1: how
        many times as long pool i takes on its median layer, and e_i = sum_j max(0, r_i w*_j - w_ij) what
        its faster layers save against that, so any set S of layers takes it W_i(S) >= r_i W*(S) - e_i;
        c_i: the most layers one stage of pool i holds in memory (one microbatch in flight, the
        optimizer state split as far as it may be); heaviest[c]: the fastest F+B of the c slowest
        layers, so pool i's layers take at most heaviest[n_i c_i] of `fastest`."""
        key = ("ratios", tuple(id(p.costs) for p in chain))
        if key not in self._front_cache:
            L = self.L
            layers = [[_fb(p)[j + 1] - _fb(p)[j] for j in range(L)] for p in chain]
            best = [min(col) for col in zip(*layers)]
            ratios, excess = [], []
            for own in layers:  # r: the median layer's; e: what layers faster than r times theirs save
                ratios_of = sorted(t / b for t, b in zip(own, best) if b > 0) or [1.0]
                r = max(1.0, ratios_of[len(ratios_of) // 2])
                ratios.append(r)
                excess.append(sum(max(0.0, r * b - t) for t, b in zip(own, best)))
            most = []
            for p in chain:
                fit = p.costs.sharded(self._shards(math.inf)).last_fit(1)
                most.append(max(f - j + 1 for j, f in enumerate(fit)))
            heaviest = (0.0, *accumulate(sorted(best, reverse=True)))
            self._front_cache[key] = (sum(best), tuple(ratios), tuple(excess), tuple(most), heaviest)
        return self._front_cache[key]

    def _minmax_stage(self, chain: tuple) -> list[float]:
        """[P]: the least largest stage, in F+B of one microbatch, of any split into P stages when every
        layer runs as fast as on the chain's fastest pool for it (memory and p2p left out)."""
        fast = ("minmax-of", tuple(id(p.costs) for p in chain))  # the same answer, found without the set
        if fast in self._front_cache:
            return self._front_cache[fast]
        key = ("minmax", chain[0].mbs, frozenset((p.gpu, p.tp) for p in chain))  # chain: any pools
        if key not in self._front_cache:
            L, top = self.L, min(self.max_stages, self.L)
            fb = [0.0]
            for j in range(L):
                fb.append(fb[-1] + min(_fb(p)[j + 1] - _fb(p)[j] for p in chain))
            by_fb = ("minmax-fb", tuple(fb))  # often one pool is the fastest on every layer
            if by_fb in self._front_cache:
                self._front_cache[key] = self._front_cache[fast] = self._front_cache[by_fb]
                return self._front_cache[key]
            out = [math.inf] * (top + 1)
            best = [fb[j] for j in range(L + 1)]  # best[j]: layers 0..j-1 in P stages
            out[1] = best[L]
            for P in range(2, top + 1):
                # the last stage is i..j-1: max(best[i], its F+B) falls then rises in i, and its
                # lowest point moves right with j (two pointers)
                nxt, i = [math.inf] * (L + 1), P - 1
                for j in range(P, L + 1):  # (max written out for speed)
                    f_j = fb[j]
                    here = best[i] if best[i] >= f_j - fb[i] else f_j - fb[i]
                    while i + 1 < j:
                        later = best[i + 1] if best[i + 1] >= f_j - fb[i + 1] else f_j - fb[i + 1]
                        if later > here:
                            break
                        i, here = i + 1, later
                    nxt[j] = here
                best = nxt
                out[P] = best[L]
            self._front_cache[key] = self._front_cache[by_fb] = out
        self._front_cache[fast] = self._front_cache[key]
        return self._front_cache[key]

    def _cross(self, a: Shape, b: Shape) -> float:
        """p2p seconds of the boundary between two pools (never on one node)."""
        key = ("cross", a.gpu, a.tp, a.zones[0][0], b.gpu, b.tp, b.zones[0][0], a.mbs)
        if key not in self._front_cache:
            x = a.mbs * self.sim.profile(a.gpu).layer_memory(1).output_bytes[1]
            la, lb = (a.tp, b.tp) if self.rt.p2p_split_over_tp else (1, 1)
            self._front_cache[key] = self.sim.network.p2p_time(x, Endpoint(a.gpu, a.zones[0][0], 0, la),
                                                               Endpoint(b.gpu, b.zones[0][0], 1, lb))
        return self._front_cache[key]

    def _chain_configs(self, chain, Ps, d_cap, intra, crosses, fill, slot_lb, upd, usd):
        """Configurations (m, D), m growing: their bounds grow too (the least bottleneck of a split that
        fits can only grow with the in-flight counts). A configuration whose bound with its sync floor
        already reaches the cutoff (or the front) is dropped before its split DP (`_least_slot`, the
        costly part), and the DP stops where the bottleneck would take the bound there."""
        M, P = self.gbs // chain[0].mbs, sum(Ps)
        if self._front:  # (the front may have grown since the family was queued)
            m_min, upd_min = -(-M // d_cap), upd / self._shards(d_cap)
            t_min = fill + (m_min - 1) * slot_lb + upd_min
            if self._front_beats(chain, t_min, _cost_bound(fill, slot_lb, upd_min, usd, M, m_min)):
                return
        after = P
        floors = []
        for p, n in zip(chain, Ps):  # the in-flight counts a pool's stages can have
            floors.append(self._recompute_floor(p, range(1, min(after, M) + 1)))
            after -= n
        floor = min(floors)
        if floor == math.inf:
            return  # no stage needs recomputing: the plain family is as good
        by_time = self._by_time
        low = max(slot_lb, floor)  # the bottleneck's least so far: it grows with m
        for m, D in self._microbatch_counts(M, d_cap):
            upd_d = upd / self._shards(D)
            base = fill + (m - 1) * low + upd_d
            if by_time and base >= self._cutoff:
                return  # the cutoff only falls: neither this configuration nor a later one can be the best
            # the least time that puts the bound at or past the K-th best plan's score (for cost: in USD at
            # usd * D per second, with a relative 1e-12 for the rounding of the division); in a Pareto
            # search also what the front already matches or beats in time and cost
            beat = self._cutoff if by_time else self._cutoff / (usd * D) * (1 + 1e-12) if usd * D > 0 \
                else math.inf
            beat = min(beat, _dominated_from(self._front, usd * D, self._p2p_egress(chain)))
            sync, cap = None, math.inf
            if base >= beat:
                continue  # (a sync floor only adds)
            if beat < math.inf:
                # with its sync floor, before the split DP (later ones, fewer replicas, may sync less)
                sync = self._sync_floor(chain, Ps, D)
                if base + sync >= beat:
                    continue
                # a bottleneck of at least `cap` puts the bound at or past the K-th best plan found (or the front)
                if m > 1:
                    cap = (beat - fill - upd_d - sync) / (m - 1)
            slot = max(low, self._least_slot(chain, Ps, m, intra, crosses, cap, self._shards(D)))
            if slot == math.inf:
                continue  # no split fits in memory
            low = slot
            t_lb = fill + (m - 1) * slot + upd_d
            if self._could_admit(t_lb, usd * D):
                yield self._bound(t_lb, usd * D), self._refine_chain, (chain, Ps, D, m, intra, crosses, sync)

    def _refine_chain(self, chain, Ps, D, m, intra, crosses, sync):
        """A tighter bound: the least gradient sync of any split (_sync_floor)."""
        if sync is None:
            sync = self._sync_floor(chain, Ps, D)
        usd = D * sum(n * p.tp * p.prices[p.zones[0][0]] for p, n in zip(chain, Ps))
        return self._bound(sync, usd), usd, self._evaluate_chain, (chain, Ps, D, m, intra, crosses, sync)

    def _sync_floor(self, chain, Ps, D) -> float:
        """A lower bound of the sync time, max_i sync_i(G_i), of every split of the chain: pool i's n_i
        stages hold its p_i parameters, so its largest stage G_i >= p_i / n_i, and its ring takes
        sync_i(x) >= a_i x + b_i (the ring's peak rate and latency, _ring_line). The least max_i over
        sum_i p_i = P_all is where the pools' lines meet (water filling):

            tau = (P_all + sum_i n_i b_i / a_i) / (sum_i n_i / a_i)   over the pools with b_i < tau

        and some stage holds at least the average, so sync >= min_i sync_i(P_all / sum n_i) too."""
        if D < 2:
            return 0.0
        total = chain[0].costs.params(0, self.L - 1)
        avg = -(-total // sum(Ps))
        old = min(self._pool_sync(avg, p, n, D)[0] for p, n in zip(chain, Ps))
        if len({p.gpu for p in chain}) == 1:
            return old  # (one GPU type: the rings differ little, and the lines would cost more than they prune)
        lines = sorted((*self._ring_line(p, n, D), n) for p, n in zip(chain, Ps))
        weight = offset = 0.0
        for i, (b, a, n) in enumerate(lines):
            weight, offset = weight + n / a, offset + n * b / a
            tau = (total + offset) / weight
            if i + 1 < len(lines) and tau > lines[i + 1][0]:
                continue  # the next pool's ring takes part too
            return max(old, tau)

    def _sync_tail(self, chain, Ps, steps: float) -> float:
        """A lower bound of the sync time of every split with m <= 1 + steps microbatches per pipeline,
        so D >= D_lo = ceil(M / (1 + steps)) pipelines: some stage holds the average parameters, and a
        ring of more replicas has no faster edge (ring_edges_of: its kinds of edge only grow) and larger
        volume and latency terms, so the rings' lines at D_lo (_ring_line) bound them all."""
        M = self.gbs // chain[0].mbs
        D_lo = -(-M // (1 + math.floor(steps))) if steps < M else 1
        if D_lo < 2:
            return 0.0
        avg = -(-chain[0].costs.params(0, self.L - 1) // sum(Ps))
        return min(a * avg + b for b, a in (self._ring_line(p, n, D_lo) for p, n in zip(chain, Ps)))

    def _ring_line(self, p: Shape, n: int, D: int) -> tuple[float, float]:
        """(b [s], a [s/parameter]): pool p's ring of D replicas (n stages each) takes at least
        a x + b for x parameters: 2 (D-1)/D * GRAD_BYTES x at the slowest edge's peak rate, plus
        2 (D-1) latencies (allreduce_time's formula; Network.peak_ring_rate)."""
        per = self._per_node(p, n)
        key = ("ring-line", p.gpu, p.tp, p.zones[0][0], per, D)
        if key not in self._front_cache:
            rate, lat = self._ring_peak(p.gpu, p.tp, ((p.zones[0][0], D),), per)
            self._front_cache[key] = (2 * (D - 1) * lat, 2 * (D - 1) / D * GRAD_BYTES / rate)
        return self._front_cache[key]

    def _least_slot(self, chain, Ps, m, intra, crosses, cap: float = math.inf, shards: int = 1) -> float:
        """The least 1F1B bottleneck (F+B and p2p of a stage) over every split of the chain whose stages
        fit in memory: a min-max dynamic program over layers. Partial splits whose bottleneck reaches
        `cap` are dropped (a stage's F+B grows with its last layer): if none is left the answer is
        at least `cap`, and `cap` is returned, a lower bound; inf: no split fits. shards: the optimizer
        state's split (Planner._shards)."""
        L, P, k = self.L, sum(Ps), len(chain)
        key = ("least-slot", tuple(id(p.costs) for p in chain), Ps, min(m, P), intra, crosses, shards)
        known = self._front_cache.get(key)  # (value, exact)
        if known is not None and (known[1] or known[0] >= cap):
            return known[0]
        inf = math.inf
        best, g = [0.0] + [inf] * L, 0  # best[j]: layers 0..j-1 in the stages so far
        for i, (p, n) in enumerate(zip(chain, Ps)):
            fb, plain = p.costs.fb, p.plain and p.plain.sharded(shards)
            left, c, right = crosses[i - 1] if i else 0.0, intra[i], crosses[i] if i < k - 1 else 0.0
            for s in range(n):
                fit = p.costs.sharded(shards).last_fit(min(P - g, m))
                # per-stage recomputation: a stage that fits without runs without (it takes less)
                pfb, pfit = (plain.fb, plain.last_fit(min(P - g, m))) if plain else (fb, fit)
                edge = 2 * ((left if s == 0 else c) + (c if s < n - 1 else right))
                top = L - (P - 1 - g)  # a layer for every stage after this one
                nxt = [inf] * (L + 1)
                for i0 in range(g, L):
                    v = best[i0]
                    if v >= cap:
                        continue
                    # stage i0..j-1 takes fb[j] - base, without recomputing up to pfit[i0] (pfb[j] - pbase),
                    # more after: it grows with j
                    base, pbase, split = fb[i0] - edge, pfb[i0] - edge, pfit[i0] + 1
                    for j in range(i0 + 1, min(fit[i0] + 1, top) + 1):
                        w = pfb[j] - pbase if j <= split else fb[j] - base
                        if w >= cap:
                            break
                        if v > w:
                            w = v
                        if w < nxt[j]:
                            nxt[j] = w
                best, g = nxt, g + 1
        exact = best[L] < cap or cap == inf
        self._front_cache[key] = (best[L] if exact else cap, exact)
        return self._front_cache[key][0]

    def _front_cut(self, usd_per_s: float, usd_fixed: float = 0.0) -> float:
        """The least bound (in the objective's units) of a plan costing `usd_per_s` USD per second, and at
        least `usd_fixed` USD per iteration more, that the Pareto front matches or beats in time and cost
        (_dominated_from); inf: none (an empty front, outside a Pareto search; or for cost at 0 USD per
        second)."""
        if usd_per_s <= 0 and not self._by_time:
            return math.inf
        return self._bound(_dominated_from(self._front, usd_per_s, usd_fixed), usd_per_s)

    def _front_beats(self, chain, t_lb: float, usd_lb: float) -> bool:
        """A Pareto search's front matches or beats a family's ideal point: none of its configurations
        takes less than t_lb seconds or costs less than usd_lb USD per iteration plus the chain's p2p
        egress c, so Planner._offer would drop each. With u = c / t_lb, _dominated_from is at most t_lb
        exactly when some plan of the front has t_f <= t_lb and c_f <= c."""
        if t_lb == math.inf:
            return True  # (no configuration at all)
        if t_lb <= 0:
            return False
        c = usd_lb + self._p2p_egress(chain)
        return _dominated_from(self._front, c / t_lb) <= t_lb * (1 - 1e-12)

    def _p2p_egress(self, chain) -> float:
        """USD per iteration of the activations and their gradients that cross zones between the chain's
        pools (every microbatch crosses each boundary both ways)."""
        key = ("egress", chain[0].mbs, chain[0].gpu, tuple(p.zones[0][0] for p in chain))
        if key not in self._front_cache:
            cl, zones = self.sim.cluster, [p.zones[0][0] for p in chain]
            x = chain[0].mbs * self.sim.profile(chain[0].gpu).layer_memory(1).output_bytes[1]
            self._front_cache[key] = sum(self.gbs // chain[0].mbs * x * (cl.egress_per_gb(a, b) +
                                                                         cl.egress_per_gb(b, a)) / 1e9
                                         for a, b in zip(zones, zones[1:]) if a != b)
        return self._front_cache[key]

    def _pool_sync(self, params: int, shape: Shape, stages: int, D: int) -> tuple:
        return self._sync(params, D, shape.gpu, shape.tp, ((shape.zones[0][0], D),), self._per_node(shape, stages))

    # -- exact evaluation -------------------------------------------------------------
    def _segment(self, pool: Shape, lo: int, n: int, left: float, c: float, right: float, room: int,
                 inflights: tuple[int, ...], shards: int = 1) -> dict:
        """For each end j (pool holds layers lo..j-1, j <= L - room): the (slot, params, first layers,
        extra) frontier of its splits into n stages. Its first stage has a boundary costing `left`
        before it (0: the pipeline's first stage), its stages `c` between them, its last `right` after
        it. extra: the F+B its recomputing stages add to the layers' F+B without recomputing (with
        per-stage recomputation, pool.plain: a stage recomputes only if it does not fit without; 0
        otherwise)."""
        costs = pool.costs.sharded(shards)
        plain = pool.plain and pool.plain.sharded(shards)
        key = ("seg", id(costs), lo, n, left, c, right, room, inflights)
        front = self._front_cache.get(key)
        if front is not None:
            return front
        L, fb, pp = self.L, costs.fb, costs.params_prefix  # compute(i, j-1) = fb[j] - fb[i]; params likewise
        front = {lo: [(0.0, 0, (), 0.0)]}
        for s in range(n):
            fit = costs.last_fit(inflights[s])
            pfit = plain.last_fit(inflights[s]) if plain else fit
            edge = 2 * ((left if s == 0 else c) + (c if s < n - 1 else right))
            top = L - room - (n - 1 - s)  # leave a layer for every stage after this one
            nxt: dict = {}
            for i, labels in front.items():
                fb_i, pp_i, end = fb[i], pp[i], min(fit[i] + 1, top)
                if plain:
                    pfb, reach = plain.fb, pfit[i]
                    for j in range(i + 1, end + 1):  # this stage is i..j-1
                        t, prm, e = fb[j] - fb_i, pp[j] - pp_i, 0.0
                        if j - 1 <= reach:
                            t = pfb[j] - pfb[i]
                        else:
                            e = t - (pfb[j] - pfb[i])
                        busy = t + edge
                        cell = nxt.setdefault(j, [])
                        cell += [(s1 if s1 > busy else busy, p1 if p1 > prm else prm, (*b1, i), e1 + e)
                                 for s1, p1, b1, e1 in labels]
                    continue
                # (the innermost loop of the chains' evaluation: written out for speed; one label is common)
                firsts = [(s1, p1, (*b1, i), e1) for s1, p1, b1, e1 in labels]
                for j in range(i + 1, end + 1):
                    busy, prm = fb[j] - fb_i + edge, pp[j] - pp_i
                    cell = nxt.get(j)
                    if cell is None:
                        cell = nxt[j] = []
                    for s1, p1, b, e1 in firsts:
                        cell.append((s1 if s1 > busy else busy, p1 if p1 > prm else prm, b, e1))
            front = {j: (pareto_extra if plain else pareto_front)(cell) for j, cell in nxt.items()}
        self._front_cache[key] = front
        return front

    def _evaluate_chain(self, chain, Ps, D, m, intra, crosses, sync_lb, best, front, top, pareto) -> None:
        L, P, k = self.L, sum(Ps), len(chain)
        micro = spread(self.gbs // chain[0].mbs, D)
        bubbles = micro[0] - 1
        zones = [p.zones[0][0] for p in chain]
        egress = self._p2p_egress(chain)
        usd_per_s = D * sum(n * p.tp * p.prices[z] for p, n, z in zip(chain, Ps, zones))
        used: dict[str, int] = {}
        for p, n, z in zip(chain, Ps, zones):
            used[z] = used.get(z, 0) + D * n * p.tp
        gpus_per_zone, gpus = tuple(used.items()), sum(used.values())
        comm = 2 * (sum((n - 1) * c for n, c in zip(Ps, intra)) + sum(crosses))
        d = self._shards(D)
        upd_lb = min(p.u for p in chain) * chain[0].costs.params(0, L - 1) / (P * d)
        # a pool is one zone, so its rings cross none (0 USD), but counted as the simulator does:
        # egress is linear in the parameters, so per parameter, times those of all the pool's stages
        ring_usd = [self._pool_sync(1, p, n, D)[1] for p, n in zip(chain, Ps)]
        starts, s0 = [], 0
        for n in Ps:
            starts.append(s0)
            s0 += n
        fast = self._fastest[chain[0].mbs]
        segments = (chain[0].mbs, tuple((p.gpu, p.tp, n, z) for p, n, z in zip(chain, Ps, zones)))

        # the K-th best plan's score, or the probe's (inf for a Pareto front), or the front's cut
        cut = min(self._cutoff, self._front_cut(usd_per_s, egress))
        scale = 1.0 if self._by_time else usd_per_s  # a bound's t_lb * scale is its objective (_bound)
        # left to right over the pools: at each pool boundary j, the undominated partial splits
        # (compute, slot, sync, update, ring USD, first layers) of layers 0..j-1
        labels: dict = {0: [(0.0, 0.0, 0.0, 0.0, 0.0, ())]}
        for i, (p, n) in enumerate(zip(chain, Ps)):
            room = P - starts[i] - n
            seg_args = (n, crosses[i - 1] if i else 0.0, intra[i], crosses[i] if i < k - 1 else 0.0, room,
                        tuple(min(P - starts[i] - s, m) for s in range(n)), d)
            costs, nxt = p.plain or p.costs, {}  # (a segment's F+B: theirs, plus its extra)
            ring = (p.gpu, p.tp, ((zones[i], D),), self._per_node(p, n))  # (_pool_sync's, written out)
            for lo, partial in labels.items():
                for j, seg in self._segment(p, lo, *seg_args).items():
                    if i == k - 1 and j != L:
                        continue
                    add, rest = costs.compute(lo, j - 1), fast[L] - fast[j]  # rest: the later pools' least
                    add_ring = ring_usd[i] * costs.params(lo, j - 1)
                    cell = nxt.setdefault(j, [])
                    least = partial[0][0] + add + rest + comm  # (partial: sorted, least compute first)
                    for s1, p1, b1, e1 in seg:
                        up1 = p.u * p1 / d
                        if (least + e1 + bubbles * s1 + sync_lb + (up1 if up1 > upd_lb else upd_lb)) * scale >= cut:
                            continue  # no partial split before it makes it enter the top K
                        sy1 = self._sync(p1, D, *ring)[0]
                        for c0, sl, sy, up, rg, bd in partial:
                            c0, sl, sy, up = c0 + add + e1, max(sl, s1), max(sy, sy1), max(up, up1)
                            t_lb = c0 + rest + comm + bubbles * sl + max(sy, sync_lb) + max(up, upd_lb)
                            if t_lb * scale >= cut:
                                continue  # cannot enter the top K
                            cell.append((c0, sl, sy, up, rg + add_ring, (*bd, *b1)))
            labels = {j: _undominated(cell) for j, cell in nxt.items() if cell}
        for c0, sl, sy, up, rg, bd in labels.get(L, ()):
            T = c0 + comm + bubbles * sl + sy + up
            self._consider(Outcome(T, T * usd_per_s + egress + rg, gpus, gpus_per_zone), (*segments, bd[1:], D),
                           best, front, top, pareto, "per stage" if any(p.plain for p in chain) else None)


def _cost_bound(fill: float, slot_lb: float, upd: float, usd: float, M: int, m_min: int) -> float:
    """Cost objective: the least USD per iteration of a family's configurations (m >= m_min microbatches
    per pipeline; the GPUs' USD/s per pipeline `usd`), at the ends of its range of m."""
    return min((fill + (m - 1) * slot_lb + upd) * usd * -(-M // m) for m in (m_min, M))


def _spread_bound(work: float, pools: list[tuple[float, float, float]]) -> float:
    """The least bottleneck `slot` of any split of `work` seconds (every layer at its fastest pool's
    speed) over pools given as (a_i, o_i, U_i): pool i's share W*_i of that work is at most U_i (the
    layers it can hold), and its n_i stages take W_i >= r_i W*_i - e_i in all, each at most slot, so
    W*_i <= a_i slot + o_i with a_i = n_i / r_i, o_i = e_i / r_i (Chains._speed_ratios). So

        work = sum_i W*_i <= g(slot) = sum_i min(a_i slot + o_i, U_i)

    and the bound is the least slot >= 0 with g(slot) >= work (inf: the pools cannot hold it all).
    g is piecewise linear: pool i leaves the slope at its breakpoint (U_i - o_i) / a_i."""
    if sum(u for _, _, u in pools) < work * (1 - 1e-12):
        return math.inf
    slope = done = 0.0  # g(t) = done + slope t up to the next breakpoint
    rising = []
    for a, o, u in pools:
        if u <= o:
            done += u  # saturated from the start
        else:
            slope, done = slope + a, done + o
            rising.append(((u - o) / a, a, u - o))
    if done >= work:
        return 0.0
    rising.sort()
    for i, (t_break, a, room) in enumerate(rising):
        t = (work - done) / slope
        if t <= t_break or i == len(rising) - 1:
            return t * (1 - 1e-12)
        slope, done = slope - a, done + room
    return math.inf  # (unreached: the sum of U_i covers the work)


def _dominated_from(front: list, usd_per_s: float, usd_fixed: float = 0.0) -> float:
    """The least iteration time from which a plan costing `usd_per_s` USD per second and at least
    `usd_fixed` USD per iteration more (egress) is matched or beaten in both time and cost by a plan of the
    Pareto front (Planner._offer then drops it): a plan of time T >= max(t_f, (c_f - usd_fixed) / usd_per_s)
    costs at least T * usd_per_s + usd_fixed >= c_f. inf: none is (an empty front: the search keeps one
    only for --pareto)."""
    return min((max(f.outcome.iteration_time_s, (f.outcome.cost_per_iteration_usd - usd_fixed) / usd_per_s)
                if usd_per_s > 0 else f.outcome.iteration_time_s if f.outcome.cost_per_iteration_usd <= usd_fixed
                else math.inf for f in front), default=math.inf)


def _undominated(labels: list) -> list:
    """The labels no other label matches or beats in every number (all but the last field)."""
    labels.sort()
    out: list = []
    for x in labels:
        if not any(y[1] <= x[1] and y[2] <= x[2] and y[3] <= x[3] and y[4] <= x[4] for y in out):
            out.append(x)
    return out


def _fb(p: Shape) -> tuple[float, ...]:
    """Prefix sums of a pool's least F+B per layer: without recomputation where the pass may recompute
    per stage (p.plain: a stage recomputes only if it does not fit without), so bounds hold."""
    return (p.plain or p.costs).fb
