"""Exact layer partitioning: the Pareto frontier of splits into stages.

For pipelines whose stages all run on one GPU type with one TP degree, the
simulator's time depends on the split only through

    slot  = max_s (F_s + B_s + 2 c * neighbours_s)    the 1F1B bottleneck, and
    G     = max_s params_s                             the largest gradient all-reduce
                                                       (and optimizer step);

sum_s (F_s + B_s) is the same for every split. Both enter the iteration time
monotonically, so for any replica count the best split lies on the Pareto
frontier of (slot, G). A stage is admissible only if it fits in GPU memory
with its 1F1B in-flight count min(stages after it + 1, microbatches).

`SplitTable` computes, right to left, cell[j][r]: the frontier of splits of
layers j..L-1 into r+1 stages whose first stage has a stage before it;
`frontier(P)` closes it with the model's first stage. The cost is
O(L^2 * P * |frontier|); frontiers hold a handful of points.

Per-stage recomputation (`plain` given): a stage recomputes its blocks only
if it does not fit without (recomputing a stage that fits only adds time).
sum_s (F_s + B_s) then grows with the recomputing stages' extra forwards
(`extra`), so the frontier is over (slot, G, extra); `split_compute` gives a
split's stage times.
"""
from __future__ import annotations

from copy import copy
from itertools import accumulate

from planner.profiles.profile import LayerMemory, LayerTimes

# A split: (slot seconds, params of the largest stage, first layer of every stage after the first
# [, extra seconds of its recomputing stages' second forwards, with per-stage recomputation])
Split = tuple


def pareto(labels: list[Split]) -> list[Split]:
    """Keep the splits no other split beats in both slot and params."""
    labels.sort()
    out, best = [], None
    for x in labels:
        if best is None or x[1] < best:
            out.append(x)
            best = x[1]
    return out


def pareto_extra(labels: list[Split]) -> list[Split]:
    """pareto() over (slot, params, extra) of per-stage-recomputation splits (slot, params, bounds, extra)."""
    labels.sort(key=lambda x: (x[0], x[1], x[3]))
    out: list[Split] = []
    for x in labels:
        prm, extra = x[1], x[3]
        for y in out:
            if y[1] <= prm and y[3] <= extra:
                break
        else:
            out.append(x)
    return out


def split_compute(costs: list["StageCosts"], plains: list["StageCosts"] | None, bounds: tuple[int, ...],
                  microbatches: int, num_layers: int) -> list[list[float]]:
    """F+B seconds of every stage of a split, for each class (GPU type, TP) running it: one for a single
    pool, two for two types side by side (JointSplitTable). With `plains` (per-stage recomputation;
    `costs` are then the recomputing ones) stage s recomputes, on every class, unless it fits every
    class without, with its 1F1B in-flight count min(P - s, microbatches)."""
    edges = (0, *bounds, num_layers)
    P = len(edges) - 1
    out: list[list[float]] = [[] for _ in costs]
    for s in range(P):
        first, last = edges[s], edges[s + 1] - 1
        inflight = min(P - s, microbatches)
        fits = plains is not None and all(p.memory(first, last, inflight) <= p.capacity for p in plains)
        for k, c in enumerate(plains if fits else costs):
            out[k].append(c.compute(first, last))
    return out


class StageCosts:
    """Facts of any layer range on one GPU type, TP degree and microbatch size."""

    def __init__(self, times: LayerTimes, mem: LayerMemory, logical: LayerMemory, *, mbs: int,
                 state_bytes: float, allocator: float, overhead: float, capacity: int, tied_params: int,
                 optimizer_step_bytes: float = 0.0, sharded_bytes: float = 0.0):
        self.mem, self.mbs, self.state_bytes, self.allocator = mem, mbs, state_bytes, allocator
        self.optimizer_step_bytes = optimizer_step_bytes
        self.sharded_bytes = sharded_bytes  # of state_bytes, what the distributed optimizer splits
        self._shards: dict[float, StageCosts] = {1: self}
        self.overhead, self.capacity, self.tied_params = overhead, capacity, tied_params
        self.num_layers = L = len(mem.params)
        self.fb = (0.0, *accumulate(f + b for f, b in zip(times.fwd, times.bwd)))  # prefix sums
        self.params_prefix = (0, *accumulate(logical.params))
        self._last_fit: dict[int, list[int]] = {}
        self.L = L
        # memory() is the search's innermost call: the simulator's formula on precomputed prefix
        # sums and range maxima (workspace[j][i - j] = largest workspace of layers j..i)
        self._gpu_params, self._acts = mem.params_prefix, mem.activation_prefix
        ws = mem.workspace_bytes or mem.activation_bytes
        self._workspace = [list(accumulate(ws[j:], max)) for j in range(L)]

    def sharded(self, d: float) -> "StageCosts":
        """These facts with the optimizer state and step split d ways (the distributed optimizer over
        d replicas; d = inf: the least memory any replica count gives). Itself without sharding."""
        if not self.sharded_bytes:
            return self
        got = self._shards.get(d)
        if got is None:
            got = copy(self)
            got.state_bytes = self.state_bytes - self.sharded_bytes * (1 - 1 / d)
            got.optimizer_step_bytes = self.optimizer_step_bytes / d
            got._last_fit, got.sharded_bytes = {}, 0.0  # (split once)
            self._shards[d] = got
        return got

    def compute(self, first: int, last: int) -> float:
        return self.fb[last + 1] - self.fb[first]

    def params(self, first: int, last: int) -> int:
        return self.params_prefix[last + 1] - self.params_prefix[first]

    def memory(self, first: int, last: int, inflight: int) -> float:
        """Bytes on one GPU of a replica holding layers first..last: simulator.memory.replica_memory,
        term by term (tests/planner/test_partition.py checks they agree exactly)."""
        params = self._gpu_params[last + 1] - self._gpu_params[first]
        if last == self.L - 1 and first > 0:
            params += self.tied_params
        acts = self._acts[last + 1] - self._acts[first]
        transient = self.allocator * self.mbs * (inflight * acts + self._workspace[first][last - first])
        return self.overhead + self.state_bytes * params + max(transient, self.optimizer_step_bytes * params)

    def last_fit(self, inflight: int) -> list[int]:
        """For each first layer j, the last layer a stage starting at j may end at (j-1 if none)."""
        out = self._last_fit.get(inflight)
        if out is None:
            # memory(j, last + 1, inflight) <= capacity, written out (the same arithmetic): this scan
            # is most of a single-pool search's bounds
            L, capacity, tied = self.L, self.capacity, self.tied_params
            gpu_params, acts, workspace = self._gpu_params, self._acts, self._workspace
            overhead, state, step = self.overhead, self.state_bytes, self.optimizer_step_bytes
            scale = self.allocator * self.mbs
            out, last = [], -1
            for j in range(L):
                # memory grows with more layers and shrinks with fewer: the reach never moves back
                if last < j - 1:
                    last = j - 1
                p0, a0, ws = gpu_params[j], acts[j], workspace[j]
                while last + 1 < L:
                    k = last + 1
                    params = gpu_params[k + 1] - p0
                    if k == L - 1 and j > 0:
                        params += tied
                    transient = scale * (inflight * (acts[k + 1] - a0) + ws[k - j])
                    least = step * params
                    if overhead + state * params + (transient if transient > least else least) > capacity:
                        break
                    last = k
                out.append(last)
            self._last_fit[inflight] = out
        return out


class SplitTable:
    """Pareto frontiers of splits of layers j..L-1, for every j and stage count."""

    def __init__(self, costs: StageCosts, comm: float, microbatches: int, max_stages: int,
                 plain: StageCosts | None = None):
        self.costs, self.comm, self.m, self.plain = costs, comm, microbatches, plain
        L = costs.L
        self.max_stages = min(max_stages, L)
        fb, pp = costs.fb, costs.params_prefix
        table: list[list[list[Split]]] = [[[] for _ in range(self.max_stages)] for _ in range(L + 1)]
        self.table = table
        if plain is not None:
            self._fill_mixed()
            return
        c2, c4 = 2 * comm, 4 * comm
        for r in range(self.max_stages - 1):  # the table's stages always have a stage before them
            fit = costs.last_fit(min(r + 1, microbatches))
            for j in range(L - 1, 0, -1):
                if r == 0:
                    if fit[j] >= L - 1:
                        table[j][0] = [(fb[L] - fb[j] + c2, pp[L] - pp[j], (j,))]
                    continue
                cell = []
                for i in range(j + 1, min(L - r, fit[j] + 1) + 1):  # this stage is j..i-1
                    nxt = table[i][r - 1]
                    if not nxt:
                        continue
                    slot = fb[i] - fb[j] + c4
                    params = pp[i] - pp[j]
                    for s2, p2, b2 in nxt:
                        cell.append((slot if slot > s2 else s2, params if params > p2 else p2, (j, *b2)))
                table[j][r] = pareto(cell) if len(cell) > 1 else cell

    def _stage(self, j: int, i: int, inflight: int) -> tuple[float, float]:
        """Per-stage recomputation: (F+B, extra) of stage j..i-1."""
        plain, costs = self.plain, self.costs
        if i - 1 <= plain.last_fit(inflight)[j]:
            return plain.fb[i] - plain.fb[j], 0.0
        t = costs.fb[i] - costs.fb[j]
        return t, t - (plain.fb[i] - plain.fb[j])

    def _reach(self, j: int, inflight: int) -> int:
        return max(self.plain.last_fit(inflight)[j], self.costs.last_fit(inflight)[j])

    def _fill_mixed(self) -> None:
        L, pp, table, comm = self.costs.L, self.costs.params_prefix, self.table, self.comm
        for r in range(self.max_stages - 1):
            f = min(r + 1, self.m)
            for j in range(L - 1, 0, -1):
                if r == 0:
                    if self._reach(j, f) >= L - 1:
                        t, e = self._stage(j, L, f)
                        table[j][0] = [(t + 2 * comm, pp[L] - pp[j], (j,), e)]
                    continue
                cell = []
                for i in range(j + 1, min(L - r, self._reach(j, f) + 1) + 1):
                    nxt = table[i][r - 1]
                    if not nxt:
                        continue
                    t, e = self._stage(j, i, f)
                    slot, params = t + 4 * comm, pp[i] - pp[j]
                    for s2, p2, b2, e2 in nxt:
                        cell.append((max(slot, s2), max(params, p2), (j, *b2), e + e2))
                table[j][r] = pareto_extra(cell) if len(cell) > 1 else cell

    def _frontier_mixed(self, stages: int) -> list[Split]:
        L, pp, f = self.costs.L, self.costs.params_prefix, min(stages, self.m)
        if stages == 1:
            if self._reach(0, f) < L - 1:
                return []
            t, e = self._stage(0, L, f)
            return [(t, pp[L], (), e)]
        if stages > self.max_stages:
            return []
        cell = []
        for i in range(1, min(L - stages + 1, self._reach(0, f) + 1) + 1):
            t, e = self._stage(0, i, f)
            slot, params = t + 2 * self.comm, pp[i]
            for s2, p2, b2, e2 in self.table[i][stages - 2]:
                cell.append((max(slot, s2), max(params, p2), b2, e + e2))
        return pareto_extra(cell)

    def frontier(self, stages: int) -> list[Split]:
        """Pareto-optimal splits of the whole model into `stages` stages."""
        if self.plain is not None:
            return self._frontier_mixed(stages)
        costs, L = self.costs, self.costs.L
        fit = costs.last_fit(min(stages, self.m))
        fb, pp = costs.fb, costs.params_prefix
        if stages == 1:
            return [(fb[L], pp[L], ())] if fit[0] >= L - 1 else []
        if stages > self.max_stages:
            return []
        cell = []
        for i in range(1, min(L - stages + 1, fit[0] + 1) + 1):
            slot, params = fb[i] + 2 * self.comm, pp[i]
            for s2, p2, b2 in self.table[i][stages - 2]:
                cell.append((slot if slot > s2 else s2, params if params > p2 else p2, b2))
        return pareto(cell)


# A joint split: (bottleneck seconds of each class, params of the largest stage, bounds, extra seconds of
# each class's recomputing stages' second forwards: zeros without per-stage recomputation)
JointSplit = tuple[tuple[float, ...], int, tuple[int, ...], tuple[float, ...]]


def pareto_joint(labels: list[JointSplit]) -> list[JointSplit]:
    """Keep the joint splits no other beats in every class's slot, in params and in every class's extra."""
    labels.sort()
    out: list[JointSplit] = []
    for x in labels:
        if not any(y[1] <= x[1] and all(a <= b for a, b in zip(y[0], x[0]))
                   and all(a <= b for a, b in zip(y[3], x[3])) for y in out):
            out.append(x)
    return out


class JointSplitTable:
    """Like SplitTable, for pipelines of several classes (GPU type, TP) sharing one split.

    Data-parallel replicas of one stage may run on different GPU types with
    different TP degrees; every class must fit each stage in memory (each class's
    busiest pipeline runs at least as many microbatches as there are stages, so
    stage s has P - s in flight), and each class has its own bottleneck. The
    frontier is over (slot of every class, largest stage's parameters).

    Per-stage recomputation (`plains`, each class's facts without it; `costs` are
    then the recomputing ones): a stage recomputes, on every class (recomputation
    is the stage's), unless it fits every class without; the frontier also keeps
    the extra seconds each class's recomputing stages add.
    """

    def __init__(self, costs: list[StageCosts], comms: list[float], max_stages: int,
                 plains: list[StageCosts] | None = None):
        self.costs, self.comms, self.plains = costs, comms, plains
        L = costs[0].L
        self.L, self.max_stages = L, min(max_stages, L)
        self.none = (0.0,) * len(costs)
        self.table: list[list[list[JointSplit]]] = [[[] for _ in range(self.max_stages)] for _ in range(L + 1)]
        self.rows = 0  # table[j][r] is filled for r < rows: up to the deepest pipeline asked for (frontier)

    def _fill(self, rows: int) -> None:
        """Fill table[j][r] for r < rows (splits of layers j.. into r + 1 stages; the last row a
        frontier of P stages reads is P - 2). Rows are filled as deep pipelines are asked for: their
        frontiers are the largest, and most tables are only asked for shallow ones."""
        L, comms, table, pp = self.L, self.comms, self.table, self.costs[0].params_prefix
        for r in range(self.rows, min(rows, self.max_stages - 1)):
            for j in range(L - 1, 0, -1):
                reach = self._reach(j, r + 1)
                if r == 0:
                    if reach >= L - 1:
                        times, extras = self._stage(j, L, 1)
                        table[j][0] = [(tuple(t + 2 * x for t, x in zip(times, comms)), pp[L] - pp[j], (j,), extras)]
                    continue
                cell = []
                for i in range(j + 1, min(L - r, reach + 1) + 1):
                    nxt = table[i][r - 1]
                    if not nxt:
                        continue
                    times, extras = self._stage(j, i, r + 1)
                    slots = tuple(t + 4 * x for t, x in zip(times, comms))
                    params = pp[i] - pp[j]
                    for s2, p2, b2, e2 in nxt:
                        cell.append((tuple(max(a, b) for a, b in zip(slots, s2)), max(params, p2), (j, *b2),
                                     tuple(a + b for a, b in zip(extras, e2))))
                table[j][r] = pareto_joint(cell) if len(cell) > 1 else cell
        self.rows = max(self.rows, rows)

    def _reach(self, j: int, inflight: int) -> int:
        """The last layer a stage from layer j may end at: it fits every class (with recomputation, if
        that is allowed)."""
        reach = min(c.last_fit(inflight)[j] for c in self.costs)
        if self.plains is not None:
            reach = max(reach, min(p.last_fit(inflight)[j] for p in self.plains))
        return reach

    def _stage(self, j: int, i: int, inflight: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(F+B of each class, extra of each class) of stage j..i-1, which fits."""
        if self.plains is not None and all(i - 1 <= p.last_fit(inflight)[j] for p in self.plains):
            return tuple(p.compute(j, i - 1) for p in self.plains), self.none
        times = tuple(c.compute(j, i - 1) for c in self.costs)
        if self.plains is None:
            return times, self.none
        return times, tuple(t - p.compute(j, i - 1) for t, p in zip(times, self.plains))

    def frontier(self, stages: int) -> list[JointSplit]:
        L, pp = self.L, self.costs[0].params_prefix
        reach = self._reach(0, stages)
        if stages == 1:
            if reach < L - 1:
                return []
            times, extras = self._stage(0, L, 1)
            return [(times, pp[L], (), extras)]
        if stages > self.max_stages:
            return []
        self._fill(stages - 1)
        cell = []
        for i in range(1, min(L - stages + 1, reach + 1) + 1):
            times, extras = self._stage(0, i, stages)
            slots = tuple(t + 2 * x for t, x in zip(times, self.comms))
            for s2, p2, b2, e2 in self.table[i][stages - 2]:
                cell.append((tuple(max(a, b) for a, b in zip(slots, s2)), max(pp[i], p2), b2,
                             tuple(a + b for a, b in zip(extras, e2))))
        return pareto_joint(cell)
