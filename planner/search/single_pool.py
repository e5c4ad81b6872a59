"""Designs on one pool of GPUs: every stage on one GPU type with one TP degree.

Pipelines fill the type's zones (cheapest first, then fastest network, then
largest); a placement that needs only some of the cheapest zones is also tried
starting from each of them. For a design the simulator's time is
    T = max_zones[sum(F+B) + 2(P-1) c_z + (m_z - 1) slot(split, c_z)] + sync(D, G) + u G
and for fixed (P, m, D) the best split is on the (slot, G) frontier (partition.SplitTable).
In auto mode's recomputing pass a stage recomputes only where it does not fit without
(per-stage recomputation: the frontier is over (slot, G, extra), and sum(F+B) is the split's).
"""
from __future__ import annotations

import math

from planner.search.goal import Outcome
from planner.search.partition import SplitTable, split_compute
from planner.search.space import Shape, capacity, spread

class SinglePool:
    """Methods of Planner; see planner.py for the search loop that calls them."""

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
        # with per-stage recomputation (shape.plain), no split takes less than none recomputing
        fb_total, params_total = (shape.plain or costs).compute(0, self.L - 1), costs.params(0, self.L - 1)
        fill = fb_total + 2 * (P - 1) * c_min
        # the bottleneck is at least the average stage (and, recomputing, a stage that needs it)
        slot_lb = max((fb_total + 4 * (P - 1) * c_min) / P, self._recompute_floor_upto(shape, P))
        if slot_lb == math.inf:
            return None
        upd = shape.u * params_total / P  # one replica's step; each of D steps 1/D with the distributed optimizer
        least_upd = upd / self._shards(d_cap)
        price = min(shape.prices.values()) * P * tp
        m_min = math.ceil(M / d_cap)
        if not self._could_admit(fill + (m_min - 1) * slot_lb + least_upd, 0.0):
            return None
        if self._by_time:
            # with D >= 2 pipelines there is a ring to sync, and it is at least as slow as a ring of two
            two = self._sync(math.ceil(params_total / P), 2, shape.gpu, tp, ((shape.zones[0][0], 2),),
                             self._per_node(shape, P))[0]
            bound = min(fill + (M - 1) * slot_lb + upd, fill + (m_min - 1) * slot_lb + least_upd + two)
        else:
            bound = min(self._bound(fill + (m - 1) * slot_lb + least_upd, price * math.ceil(M / m))
                        for m in (m_min, M))
        return bound, (shape, P, caps, d_cap, fill, slot_lb, upd)

    def _single_configs(self, shape, P, caps, d_cap, fill, slot_lb, upd):
        tp = shape.tp
        floor = self._recompute_floor(shape, range(1, min(P, self.gbs // shape.mbs) + 1))
        if floor == math.inf:
            return  # no stage needs recomputing: the plain family is as good
        slot_lb = max(slot_lb, floor)
        cheapest = min(shape.prices[z] for z, _ in shape.zones)
        # Zones at the lowest price are interchangeable for cost, and the fill order's network key
        # is a heuristic: a placement that needs fewer of them is tried starting from each one.
        firsts = [i for i, (z, _) in enumerate(shape.zones) if shape.prices[z] == cheapest]
        orders = [[i, *(j for j in range(len(shape.zones)) if j != i)] for i in firsts]
        zones, prices = shape.zones, shape.prices
        for m, D in self._microbatch_counts(self.gbs // shape.mbs, d_cap):
            seen = set()
            t_lb = fill + (m - 1) * slot_lb + upd / self._shards(D)
            for order in orders:
                placed, left = [], D
                for i in order:
                    k = caps[i] if caps[i] < left else left
                    if k:
                        placed.append((zones[i][0], k))
                        left -= k
                        if not left:
                            break
                kept = frozenset(placed)
                if kept in seen:
                    continue  # the same zones and counts as an earlier order
                seen.add(kept)
                usd = sum(k * P * tp * prices[z] for z, k in placed)
                if self._could_admit(t_lb, usd):
                    yield self._bound(t_lb, usd), self._refine_single, (shape, P, D, m, placed)

    def _refine_single(self, shape: Shape, P: int, D: int, m: int, placed):
        """What a tighter bound adds: the largest stage holds at least the average number of parameters.
        A ring's sync not worked out yet is first bounded cheaply (Planner._ring_sync_floor): configurations
        that bound already puts past the best plan never cost an exact one."""
        tp = shape.tp
        ring = (math.ceil(shape.costs.params(0, self.L - 1) / P), D, shape.gpu, tp, tuple(placed),
                self._per_node(shape, P))
        usd = sum(k * P * tp * shape.prices[z] for z, k in placed)
        cfg = (shape, P, D, m, placed)
        if D > 1 and ring not in self._sync_cache:  # (None: the queue resumes with _refine_exact)
            return self._bound(self._ring_sync_floor(*ring), usd), usd, None, (self._refine_exact, (ring, usd, cfg))
        return self._refine_exact(ring, usd, cfg)

    def _refine_exact(self, ring: tuple, usd: float, cfg: tuple):
        return self._bound(self._sync(*ring)[0], usd), usd, self._evaluate_single, cfg

    def _table(self, shape: Shape, comm: float, m: int, P: int, per_stage: bool = False, D: int = 1) -> SplitTable:
        """per_stage: with per-stage recomputation (auto mode's recomputing pass; single-pool designs).
        D: the stage's replicas (what fits depends on them with the distributed optimizer)."""
        d = self._shards(D)
        plain = shape.plain.sharded(d) if per_stage and shape.plain is not None else None
        key = (comm, m if m < P else None, plain is not None, d)
        if key not in shape.tables:
            shape.tables[key] = SplitTable(shape.costs.sharded(d), comm, m if m < P else self.max_stages,
                                           self.max_stages, plain)
        return shape.tables[key]

    def _evaluate_single(self, shape: Shape, P: int, D: int, m: int, placed, best, front, top, pareto) -> None:
        tp, n, d = shape.tp, shape.per_node, self._shards(D)
        costs, plain = shape.costs.sharded(d), shape.plain and shape.plain.sharded(d)  # what fits with D replicas
        same_node = P * tp <= n
        c = {z: (shape.comm[(z, same_node)] if P > 1 else 0.0) for z, _ in placed}
        splits = self._table(shape, max(c.values()), m, P, per_stage=True, D=D).frontier(P)
        if not splits:
            return  # no split fits in memory
        micro = spread(self.gbs // shape.mbs, D)
        per = self._per_node(shape, P)
        gpus_per_zone = tuple((z, k * P * tp) for z, k in placed)
        usd_per_s = sum(g * shape.prices[z] for z, g in gpus_per_zone)
        busiest, k0 = [], 0  # (c, microbatches) of the busiest pipeline in each zone
        for z, k in placed:
            busiest.append((c[z], micro[k0]))
            k0 += k
        zones_k = tuple(z for z, k in placed for _ in range(k))  # the zone of each pipeline
        # every stage's ring crosses the same zones: the egress of all of them is that of one
        # ring carrying the whole model's gradients, whatever the split
        egress = self._sync(costs.params(0, self.L - 1), D, shape.gpu, tp, tuple(placed), per)[1]
        for split in splits:
            params, bounds = split[1], split[2]
            # F+B of each stage (a stage recomputes only where the most microbatches in flight need it)
            fb = split_compute([costs], plain and [plain], bounds, m, self.L)[0]
            t_pp = max(sum(fb) + 2 * (P - 1) * cz + (mz - 1) * max(
                t + 2 * cz * ((s > 0) + (s < P - 1)) for s, t in enumerate(fb)) for cz, mz in busiest)
            sync = self._sync(params, D, shape.gpu, tp, tuple(placed), per)[0]
            T = t_pp + sync + shape.u * params / d
            self._consider(Outcome(T, T * usd_per_s + egress, D * P * tp, gpus_per_zone),
                           (shape.mbs, ((shape.gpu, tp, P, zones_k),), bounds, D), best, front, top, pareto,
                           "per stage" if shape.plain is not None else None)
