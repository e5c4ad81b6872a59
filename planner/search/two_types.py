"""Pipelines of two GPU types side by side (data parallelism across types).

Every stage has replicas of both types, each type with its own TP degree; the
types' pipelines run their own microbatch counts, so faster GPUs take more
samples. Each type runs as many pipelines as its GPUs hold (or they share M/P
pipelines when the batch is the limit); each type's busiest pipeline runs at
least P microbatches. The shared split is an exact frontier over (slot of each
type, G) (partition.JointSplitTable); the microbatch split, any number t to one
type spread over its pipelines, is where the two types' times cross
(space.crossing). Each type fills its zones in its own fill order; where the two
orders start in different zones, the pair is also searched with one type's
order starting in the other's first zone, so that both can share a zone (a
mixed ring inside one zone, where the own orders would cross zones). In auto
mode's recomputing pass a stage recomputes, on both types, unless both fit it
without.
"""
from __future__ import annotations

import math
from dataclasses import replace

from planner.search.goal import Outcome
from planner.search.partition import JointSplitTable, split_compute
from planner.search.space import Shape, capacity, crossing, ring_edges_of, spread
from planner.simulator.network import Endpoint
from planner.simulator.simulate import GRAD_BYTES

class TwoTypes:
    """Methods of Planner; see planner.py for the search loop that calls them."""

    def _class_pairs(self, shapes: list[Shape]):
        """(X, Y, orders): two GPU types (each over all its zones) with the same microbatch size, and the
        zone orders to fill: (X, Y) in their own fill orders; where those start in different zones, also
        with Y's order starting in X's first zone, and X's in Y's."""
        for x in shapes:
            for y in shapes:
                if x.mbs == y.mbs and x.gpu < y.gpu:
                    orders = [(x, y)]
                    if x.zones[0][0] != y.zones[0][0]:
                        if (moved := _starting_in(y, x.zones[0][0])) is not None:
                            orders.append((x, moved))
                        if (moved := _starting_in(x, y.zones[0][0])) is not None:
                            orders.append((moved, y))
                    yield x, y, orders

    def _balance(self, M: int, P: int, classes) -> tuple[float, int]:
        """A lower bound of the pipeline time over how M microbatches split between two classes.

        classes = [(D, fill, slot), (D, fill, slot)]: t microbatches go to the first class, spread
        evenly over its pipelines (the busiest runs ceil(t / D)), M - t to the second, and each class's
        busiest pipeline runs at least P (so the 1F1B in-flight count is P - s): a class takes at least
        fill + (max(P, ceil(share / D)) - 1) slot. That holds for any t and for at most D pipelines of
        each class, so the least over t = 0..M (where the rising and falling times cross) bounds them.
        Returns (time, t).
        """
        key = ("balance", M, P, *classes[0], *classes[1])  # (a pair's zone orders ask the same)
        if key not in self._front_cache:
            (dx, fx, sx), (dy, fy, sy) = classes

            def times(t):
                return fx + (max(P, -(-t // dx)) - 1) * sx, fy + (max(P, -(-(M - t) // dy)) - 1) * sy

            self._front_cache[key] = crossing(0, M, times)
        return self._front_cache[key]

    def _two_class_family(self, x: Shape, y: Shape, P: int, cutoff: float = math.inf):
        """(bound, args) of the pipelines of X and Y with P stages each; None if the bound reaches `cutoff`."""
        M = self.gbs // x.mbs
        if min(self._recompute_floor_upto(x, P), self._recompute_floor_upto(y, P)) == math.inf:
            return None  # no stage needs recomputing: the plain family is as good
        (dx, lx), (dy, ly) = self._class_facts(x, P), self._class_facts(y, P)
        caps, lbs = [dx, dy], [lx, ly]
        if min(caps) < 1 or caps[0] + caps[1] > M:
            caps = [min(c, M) for c in caps]
        if min(caps) < 1:
            return None
        most = M // P  # every pipeline runs at least P microbatches
        if most < 2:
            return None
        members = min(caps[0] + caps[1], most)  # every configuration's ring (_two_class_configs)
        upd = min(x.u, y.u) * x.costs.params(0, self.L - 1) / (P * self._shards(members))
        # each class runs at least P microbatches, so _balance's time is at least either's time then
        least = max(lbs[0][0] + (P - 1) * lbs[0][1], lbs[1][0] + (P - 1) * lbs[1][1])
        if self._by_time and least + upd >= cutoff:
            return None
        ideal = self._balance(M, P, [(min(caps[0], most - 1), *lbs[0]), (min(caps[1], most - 1), *lbs[1])])
        price = min(x.prices.values()) * P * x.tp + min(y.prices.values()) * P * y.tp  # one pipeline each
        t = ideal[0] + upd
        if (t if self._by_time else t * price) >= cutoff:
            return None  # (the sync only adds to it)
        # the ring's largest stage has at least the average number of parameters
        t += self._mixed_edge_floor(x, y, members, math.ceil(x.costs.params(0, self.L - 1) / P))
        bound = t if self._by_time else t * price
        return bound, (x, y, P, caps, lbs, upd)

    def _mixed_edge_floor(self, x: Shape, y: Shape, members: int, params: int) -> float:
        """Least sync seconds of any ring of `members` replicas of both types over stages of `params`
        parameters or more: the ring has an edge from an X node to a Y node and one back, and takes at
        least as long as its slower one at the fastest rate any of the types' zones give it
        (Network.peak_ring_rate; allreduce_time's formula)."""
        key = ("pair-rate", x.gpu, x.tp, y.gpu, y.tp)
        got = self._sync_cache.get(key)
        if got is None:
            net, rates, lats = self.sim.network, [], []
            for a, b in ((x, y), (y, x)):
                links = [net.peak_ring_rate(Endpoint(a.gpu, za, 0, a.tp), Endpoint(b.gpu, zb, 1, b.tp))
                         for za, _ in a.zones for zb, _ in b.zones]
                rates.append(max(r for r, _ in links))
                lats.append(min(lat for _, lat in links))
            got = self._sync_cache[key] = (min(rates), max(lats))
        if members < 2:
            return 0.0
        rate, lat = got
        volume = 2 * (members - 1) / members * (GRAD_BYTES * params)
        return (volume / rate + 2 * (members - 1) * lat) * (1 - 1e-12)  # float rounding never lifts it past the sync

    def _class_facts(self, sh: Shape, P: int) -> tuple:
        """(pipelines of P stages the type's zones hold, (fill, slot) lower bounds of one): a type
        takes part in many pairs, so once per type and P."""
        key = ("class", id(sh), P)
        if key not in sh.tables:
            d = sum(capacity(cnt, sh.per_node, P, sh.tp) for _, cnt in sh.zones)
            if self.goal.max_gpus is not None:
                d = min(d, self.goal.max_gpus // (P * sh.tp))
            same = P * sh.tp <= sh.per_node
            c = min(sh.comm[(z, same)] for z, _ in sh.zones) if P > 1 else 0.0
            fb = (sh.plain or sh.costs).compute(0, self.L - 1)  # (recomputing per stage, a type may run none)
            sh.tables[key] = (d, (fb + 2 * (P - 1) * c, (fb + 4 * (P - 1) * c) / P))
        return sh.tables[key]

    def _two_class_configs(self, x, y, P, caps, lbs, upd):
        """Configurations (D_X, D_Y), in bound order: each class runs as many pipelines as its GPUs
        hold, unless that exceeds M/P pipelines in all (each must run at least P microbatches);
        then every way to share the M/P pipelines between the classes. Those ways come in blocks of
        consecutive D_X, each bounded first by a relaxation (`_relaxed_time`) and only worked out
        if the search gets to it; a configuration's key is also at most the next block's bound."""
        M = self.gbs // x.mbs
        flights = range(1, min(P, M) + 1)
        if min(self._recompute_floor(x, flights), self._recompute_floor(y, flights)) == math.inf:
            return  # no stage needs recomputing: the plain family is as good
        most = M // P
        zone_caps = [[(z, capacity(cnt, sh.per_node, P, sh.tp)) for z, cnt in sh.zones] for sh in (x, y)]

        def configs(dxs):
            out = []
            for dx in dxs:
                dy = most - dx if caps[0] + caps[1] > most else caps[1]
                if _shares(M, P, dx, dy) is None:
                    continue
                ideal = self._balance(M, P, [(dx, *lbs[0]), (dy, *lbs[1])])
                placed = [_fill(caps_c, d) for caps_c, d in zip(zone_caps, (dx, dy))]
                usd = sum(k * P * sh.tp * sh.prices[z] for sh, pl in zip((x, y), placed) for z, k in pl)
                if self._could_admit(ideal[0] + upd, usd) and self._within_quotas(x, y, P, placed):
                    out.append((ideal[0] + upd, self._refine_two_class, (x, y, P, dx, dy, placed, 0.0)))
            return sorted(out, key=lambda c: c[0])

        if caps[0] + caps[1] <= most:
            yield from configs([caps[0]])
            return
        lo, hi = max(1, most - caps[1]), min(caps[0], most - 1)
        size = max(1, math.isqrt(hi - lo + 1))
        avg = math.ceil(x.costs.params(0, self.L - 1) / P)
        blocks = []
        for a in range(lo, hi + 1, size):
            b = min(a + size - 1, hi)
            t = min(_relaxed_time(M, a, most - a, *lbs[0], *lbs[1]), _relaxed_time(M, b, most - b, *lbs[0], *lbs[1]))
            # every ring of the block crosses at least the zones its classes fill at its ends
            spans = ((_zones_used(zone_caps[0], a), _zones_used(zone_caps[0], b)),
                     (_zones_used(zone_caps[1], most - b), _zones_used(zone_caps[1], most - a)))
            blocks.append((t + upd + self._mixed_ring_floor(x, y, P, avg, most, zone_caps, spans), a, b))
        blocks.sort()
        for k, (block_bound, a, b) in enumerate(blocks):
            later = blocks[k + 1][0] if k + 1 < len(blocks) else math.inf
            for bound, refine, cfg in configs(range(a, b + 1)):
                key = min(max(bound, block_bound), later)
                yield key, refine, (*cfg[:-1], key - bound)

    def _mixed_ring_floor(self, x: Shape, y: Shape, P: int, avg: int, members: int, zone_caps, spans) -> float:
        """Least sync seconds of any mixed ring in which class c fills between spans[c] = (least, most)
        of its zones (those it can hold pipelines in, in fill order). A ring takes as long as its
        slowest distinct edge (and largest latency), so each edge it surely has bounds it: from each
        filled zone but its last to the next, between the nodes of a zone it fills wholly, and from
        each class's last zone (one of its possible ones) to the other's first."""
        key = ("mixed-floor", x.gpu, x.tp, y.gpu, y.tp, P, avg, members, spans, tuple(map(tuple, zone_caps)))
        if key not in self._sync_cache:
            shapes, used = (x, y), [[z for z, cap in zc if cap > 0] for zc in zone_caps]
            sure = []
            for sh, zc, zs, (least, _) in zip(shapes, zone_caps, used, spans):
                q = self._per_node(sh, P)
                full = [cap for _, cap in zc if cap > 0]
                sure += [(Endpoint(sh.gpu, zs[i], 0, sh.tp), Endpoint(sh.gpu, zs[i + 1], 1, sh.tp), 1)
                         for i in range(least - 1)]
                sure += [(Endpoint(sh.gpu, zs[i], 0, sh.tp), Endpoint(sh.gpu, zs[i], 1, sh.tp), 1)
                         for i in range(least - 1) if full[i] > q]
            floor = self.sim.edges_sync(avg, members, sure)[0] if sure else 0.0
            for c in (0, 1):  # class c's last zone to the other class's first
                src, dst = shapes[c], shapes[1 - c]
                least, most = spans[c]
                first = Endpoint(dst.gpu, used[1 - c][0], 1, dst.tp)
                floor = max(floor, min(self.sim.edges_sync(avg, members, [(Endpoint(src.gpu, used[c][i], 0, src.tp),
                                                                            first, 1)])[0]
                                       for i in range(max(least, 1) - 1, max(most, 1))))
            self._sync_cache[key] = floor
        return self._sync_cache[key]

    def _refine_two_class(self, x, y, P, dx, dy, placed, counted=0.0):
        """What a tighter bound adds: the sync of an average stage over the mixed ring (less what the
        configuration's bound already counted of it)."""
        avg = math.ceil(x.costs.params(0, self.L - 1) / P)
        # the ring's time depends on its distinct edges only: zones in order, and whether a zone's
        # replicas share a node and span nodes (one ring per such signature, not per placement)
        sig = tuple(tuple((z, k > -(-k // q), k > q) for z, k in pl)
                    for pl, q in zip(placed, (self._per_node(x, P), self._per_node(y, P))))
        key = ("class-sync", x.gpu, x.tp, y.gpu, y.tp, P, avg, dx + dy, sig)
        if key not in self._sync_cache:
            self._sync_cache[key] = self.sim.edges_sync(avg, dx + dy, self._class_ring((x, y), P, placed))[0]
        sync = self._sync_cache[key]
        usd = sum(k * P * sh.tp * sh.prices[z] for sh, pl in zip((x, y), placed) for z, k in pl)
        return max(0.0, sync - counted), usd, self._evaluate_two_class, (x, y, P, dx, dy, placed)

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
        d = self._shards(dx + dy)
        costs = [x.costs.sharded(d), y.costs.sharded(d)]
        # per-stage recomputation (auto mode's recomputing pass): a stage recomputes unless both types fit it
        plains = [x.plain.sharded(d), y.plain.sharded(d)] if x.plain and y.plain else None
        key = ("classes", id(costs[0]), id(costs[1]), max(comms[0].values()), max(comms[1].values()))
        if key not in self._front_cache:
            self._front_cache[key] = JointSplitTable(costs, [max(c.values()) for c in comms], self.max_stages, plains)
        splits = self._front_cache[key].frontier(P)
        shares = _shares(M, P, dx, dy)  # (configurations without any are not made)
        edges = self._class_ring((x, y), P, placed)
        gpus_per_zone: dict[str, int] = {}
        usd_per_s = 0.0
        for sh, pl in zip(shapes, placed):
            for z, k in pl:
                gpus_per_zone[z] = gpus_per_zone.get(z, 0) + k * P * sh.tp
                usd_per_s += k * P * sh.tp * sh.prices[z]
        gpus = sum(gpus_per_zone.values())
        u = max(x.u, y.u)
        # every stage's ring is the same mixed ring: all of them send the whole model's gradients
        egress = self.sim.edges_sync(x.costs.params(0, self.L - 1), dx + dy, edges)[1]
        for _, params, bounds, _ in splits:
            # (fill, slot, pipelines) of each zone of each class: the exact per-zone pipeline times (each
            # class's busiest pipeline runs P microbatches or more, so stage s has P - s in flight)
            zone_times = []
            for fb, cz, pl in zip(split_compute(costs, plains, bounds, P, self.L), comms, placed):
                zone_times.append([(sum(fb) + 2 * (P - 1) * cz[z], _slot(fb, cz[z]), k) for z, k in pl])
            def times(t):  # exact (X's time, Y's time) when X's pipelines run t microbatches in all
                return self._class_time(zone_times[0], t, dx), self._class_time(zone_times[1], M - t, dy)

            # X's time only grows with t (spread adds one to one pipeline) and Y's only falls: the best t
            # is where they cross
            t_pp, t = crossing(*shares, times)
            micro_x, micro_y = spread(t, dx), spread(M - t, dy)
            sync = self.sim.edges_sync(params, dx + dy, edges)[0]
            T = t_pp + sync + u * params / d
            zones_x = tuple(z for z, k in placed[0] for _ in range(k))
            zones_y = tuple(z for z, k in placed[1] for _ in range(k))
            self._consider(Outcome(T, T * usd_per_s + egress, gpus, tuple(gpus_per_zone.items())),
                           ("classes", x.mbs, ((x.gpu, x.tp, zones_x, micro_x), (y.gpu, y.tp, zones_y, micro_y)), bounds),
                           best, front, top, pareto, "per stage" if plains else None)

    @staticmethod
    def _class_time(zone_times, total: int, pipelines: int) -> float:
        """Slowest pipeline of a class running `total` microbatches spread over its pipelines (the first
        total % pipelines run one more): each zone's first (busiest) pipeline, over that zone's links."""
        q, r = divmod(total, pipelines)
        worst, k0 = 0.0, 0
        for fill, slot, k in zone_times:
            worst = max(worst, fill + (q + (k0 < r) - 1) * slot)
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


def _slot(fb: list[float], c: float) -> float:
    """1F1B bottleneck of stages of these F+B seconds when each boundary costs c seconds."""
    P = len(fb)
    return max(t + 2 * c * ((s > 0) + (s < P - 1)) for s, t in enumerate(fb))


def _starting_in(sh: Shape, zone: str) -> Shape | None:
    """The shape with its fill order starting in `zone` (the rest in order); None if it has no GPUs there.
    (Its tables are the shape's: what they hold does not depend on the zones' order.)"""
    first = [zc for zc in sh.zones if zc[0] == zone]
    return replace(sh, zones=first + [zc for zc in sh.zones if zc[0] != zone], tables=sh.tables) if first else None


def _fill(zone_caps: list[tuple[str, int]], D: int) -> list[tuple[str, int]]:
    """D pipelines over zones in fill order, each zone with as many as it holds: [(zone, pipelines)]."""
    placed, left = [], D
    for z, cap in zone_caps:
        k = min(cap, left)
        if k:
            placed.append((z, k))
            left -= k
    return placed


def _shares(M: int, P: int, dx: int, dy: int) -> tuple[int, int] | None:
    """(least, most) microbatches the first class can take in all: every pipeline runs one or more and
    each class's busiest P or more (ceil(t / dx) >= P and ceil((M - t) / dy) >= P); None if none."""
    lo, hi = max(dx, dx * (P - 1) + 1), min(M - dy, M - dy * (P - 1) - 1)
    return (lo, hi) if lo <= hi else None


def _relaxed_time(M: int, dx: int, dy: int, fx: float, sx: float, fy: float, sy: float) -> float:
    """A lower bound of _balance's time: the least t at which dx pipelines of (fill fx, slot sx) and dy of
    (fy, sy) hold M microbatches, each pipeline (t - f)/s + 1 of them (no rounding, no minimum).
    For a fixed t what they hold is linear in dx, so over dx in [a, b] (dx + dy fixed) the least
    such t is at a or at b."""
    rate, const, terms = 0.0, 0.0, sorted(((fx - sx, dx, sx), (fy - sy, dy, sy)))
    for k, (start, d, s) in enumerate(terms):  # from t = start on, a class holds d (t - start) / s
        rate, const = rate + d / s, const + d * start / s
        t = (M + const) / rate
        if k + 1 == len(terms) or t <= terms[k + 1][0]:
            return max(t, start)
    return math.inf


def _zones_used(zone_caps: list[tuple[str, int]], D: int) -> int:
    """How many zones (of those that hold any), in fill order, D pipelines take."""
    n, held = 0, 0
    for _, cap in zone_caps:
        if held >= D:
            break
        if cap > 0:
            n, held = n + 1, held + cap
    return n
