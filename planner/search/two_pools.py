"""Designs on two pools: the first stages on pool A, the rest on pool B.

A is another GPU type (up to four first stages: cheap or memory-light GPUs for
the embedding end) or the same type in another zone (up to two: pipelines that
cross a region boundary once, while gradient rings stay inside each zone).
For each first layer q of pool B, the splits of layers 0..q-1 on A and of
q..L-1 on B are exact Pareto frontiers; their product is evaluated.
"""
from __future__ import annotations

import math
from dataclasses import replace

from planner.search.goal import Outcome
from planner.search.partition import pareto as pareto_front
from planner.search.space import FIRST_POOL_STAGES, Shape, capacity, spread
from planner.simulator.network import Endpoint

class TwoPools:
    """Methods of Planner; see planner.py for the search loop that calls them."""

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

    def _two_pool_bound(self, a: Shape, b: Shape, cutoff: float = math.inf) -> float:
        """A lower bound over every (P1, P2) family of the pair (cheap: no family is built).

        Any pipeline computes at least `least` seconds per microbatch; with P stages
        its bottleneck is at least least/P; D pipelines fit pool A with P1 stages
        (at most cap_a) and pool B with P2 stages (at most count_b / (P2 tp_b)), so
        (m - 1)/P >= (M/min(cap_a, B/P2) - 1)/(P1 + P2), smallest at P2 = B/cap_a.
        For cost, every pipeline pays at least M * least/P seconds of P GPUs. A recomputing pair
        (auto mode) has a stage that needs it, whose time bounds the bottleneck too; that is
        only worked out if the pair could beat `cutoff` (the best plan of an earlier pass).
        """
        L, M = self.L, self.gbs // a.mbs
        if min(self._recompute_floor_upto(a), self._recompute_floor_upto(b)) == math.inf:
            return math.inf
        fa, fb = a.costs.fb, b.costs.fb
        least = min(fa[q] + fb[L] - fb[q] for q in range(1, L))
        (za, na), (zb, nb) = a.zones[0], b.zones[0]
        if self.goal.objective != "throughput":
            return M * least * min(a.tp * a.prices[za], b.tp * b.prices[zb])
        B = nb / b.tp
        best, caps = math.inf, []
        for P1 in range(1, self._first_pool_stages(a, b) + 1):
            cap_a = capacity(na, a.per_node, P1, a.tp)
            if cap_a >= 1:
                caps.append((P1, cap_a))
                for P2 in {max(1, math.floor(B / cap_a)), max(1, math.ceil(B / cap_a))}:
                    d = min(cap_a, B / P2, M)
                    best = min(best, (max(M / d, 1) - 1) / (P1 + P2))
        plain = least * (1 + best) if best < math.inf else math.inf
        if (a.plain is None and b.plain is None) or plain >= cutoff:
            return plain
        best = math.inf  # recomputing: the floor shrinks as P grows, so every P2 from B/cap_a on
        for P1, cap_a in caps:
            for P2 in range(max(1, math.floor(B / cap_a)), self.max_stages - P1 + 1):
                P, d = P1 + P2, min(cap_a, B / P2, M)
                spread_lb = (max(M / d, 1) - 1) * least / P  # grows with P2 from B/cap_a on: stop there
                if spread_lb >= best:
                    break
                floor = min(self._recompute_floor_upto(a, P), self._recompute_floor_upto(b, P2))
                best = min(best, (max(M / d, 1) - 1) * max(floor, least / P))
                if least + best < cutoff:
                    return least  # searched anyway: no need for the exact bound
        return least + best

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
        floor = min(self._recompute_floor_upto(a), self._recompute_floor_upto(b))  # 0 unless recomputing
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
                fill, slot_lb, upd = fb_min + 2 * comm, max((fb_min + 4 * comm) / P, floor), u * params_total / P
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
        M, L = self.gbs // a.mbs, self.L
        floor = min(self._recompute_floor(a, range(1, min(P1 + P2, M) + 1)),
                    self._recompute_floor(b, range(1, min(P2, M) + 1)))
        if floor == math.inf:
            return  # no stage needs recomputing: the plain family is as good
        # the bottleneck is at least the average stage of each pool, wherever pool B starts
        fa, fb = a.costs.fb, b.costs.fb
        balanced = min(max(fa[q] / P1, (fb[L] - fb[q]) / P2) for q in range(P1, L - P2 + 1))
        slot_lb = max(slot_lb, floor, balanced)
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
        # a pool is one zone, so its gradient rings cross none (0 USD), but counted as the simulator does:
        # egress is linear in the parameters, so per parameter, times those of all stages of the pool
        egress_a, egress_b = self._pool_sync(1, a, P1, D)[1], self._pool_sync(1, b, P2, D)[1]
        for q in range(P1, L - P2 + 1):  # the first layer of the second pool
            front_a, front_b = fronts_a[q], fronts_b.get(q)
            if not front_a or not front_b:
                continue
            fill = ca.compute(0, q - 1) + cb.compute(q, L - 1) + 2 * ((P1 - 1) * c_a + c_ab + (P2 - 1) * c_b)
            ring_egress = egress_a * ca.params(0, q - 1) + egress_b * cb.params(q, L - 1)  # all stages' rings
            full = not pareto and len(best) == top
            for slot_a, params_a, bounds_a in front_a:
                sync_a = self._pool_sync(params_a, a, P1, D)
                for slot_b, params_b, bounds_b in front_b:
                    t_pp = fill + bubbles * (slot_a if slot_a > slot_b else slot_b)
                    if full and self._bound(t_pp + sync_lb + upd_lb, usd_per_s) >= -best[0][0]:
                        continue  # cannot enter the top K, whatever its sync
                    sync_b = self._pool_sync(params_b, b, P2, D)
                    T = t_pp + max(sync_a[0], sync_b[0]) + max(a.u * params_a, b.u * params_b)
                    cost = T * usd_per_s + egress + ring_egress
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
