"""FlashFlex-style planning: identical mixed-GPU pipelines with an uneven, capacity-proportional layer split.

FlashFlex (2024) trains over whatever heterogeneous GPUs are given: it groups
them into pipelines whose stages may run on different GPU types with their
own TP degrees, and gives each stage a share of the layers in proportion to
its compute capacity, moving layers off stages that would not fit in memory.

Rules:
  * every GPU type given is used (zones ignored): each pipeline has P_i
    stages of type i with TP degree t_i, stages ordered by GPU memory (the
    largest first: early stages keep the most activations in flight);
    D = min_i (N_i // (P_i t_i)) identical pipelines;
  * transformer blocks shared out in proportion to each stage's peak FLOP/s
    (t_i x the type's peak), embedding on the first stage, head on the last;
    while a stage does not fit (MemoryView.TENSORS), one block moves to its
    neighbour with the most free memory;
  * one microbatch size, the batch split evenly over the pipelines.

Cost model: the 1F1B estimate from the profiled stage times and p2p, plus
the slowest stage's ring all-reduce (a flat network: zones are not modelled).
The proportional split is FlashFlex's heuristic; it ignores that the head and
embedding layers cost differently from a block.
"""
from __future__ import annotations

import math
from itertools import product

from planner.baselines.common import (
    INF, BaselineResult, MemoryView, Toolkit, bounds_from_counts, by_type, check_inputs, devices, even_shares,
    fits_available, make_plan, pipeline_estimate, proportional_bounds, rank_order, stage_ranges, timed,
)
from planner.errors import SailorError
from planner.simulator.simulate import Simulator
from planner.specs.plan import Replica

NAME = "flashflex"
MEMORY = MemoryView.TENSORS
MAX_STAGES = 8  # per pipeline
MAX_MOVES = 64


@timed
def plan(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """The (stages and TP per type, microbatch size) with the lowest FlashFlex estimate."""
    check_inputs(NAME, sim, global_batch)
    given = devices(sim.cluster)
    kit = Toolkit(sim, runtime, flat_zone=given[0][1])
    groups = by_type(given)
    order = sorted(groups, key=lambda g: -sim.cluster.gpu(g).memory_bytes)
    model = sim.model
    max_per_type = max(1, min(MAX_STAGES - len(order) + 1, model.num_blocks))
    best, looked = None, 0
    sizes = sorted({b for g in order for b, _ in kit.configs(g)})
    for mbs in sizes:
        if global_batch % mbs:
            continue
        M = global_batch // mbs
        for counts in product(range(1, max_per_type + 1), repeat=len(order)):
            if sum(counts) > min(MAX_STAGES, model.num_blocks):
                continue
            options = [[t for b, t in kit.configs(g) if b == mbs] for g in order]
            for tps in product(*options):
                D = min(min(len(groups[g]) // (n * t) for g, n, t in zip(order, counts, tps)), M)
                if D < 1:
                    continue
                looked += 1
                stages = [(g, t) for g, n, t in zip(order, counts, tps) for _ in range(n)]
                estimate, bounds = _estimate(kit, stages, mbs, D, M)
                if estimate < INF and (best is None or estimate < best[0]):
                    candidate = _plan(sim, global_batch, groups, stages, bounds, D, mbs, runtime)
                    if candidate is not None:
                        best = (estimate, candidate)
    if best is None:
        raise SailorError(f"{NAME}: no pipeline over every GPU type given fits the model in memory")
    return BaselineResult(NAME, best[1], best[0], math.nan, looked)


def _estimate(kit: Toolkit, stages: list[tuple[str, int]], mbs: int, D: int, M: int):
    sim, model = kit.sim, kit.sim.model
    P = len(stages)
    weights = [t * sim.cluster.gpu(g).peak_flops(sim.precision) for g, t in stages]
    bounds = proportional_bounds(model.num_blocks, weights)
    if bounds is None:
        return INF, ()
    m = math.ceil(M / D)
    costs = [kit.costs(g, mbs, t) for g, t in stages]
    bounds = _fit_memory(costs, bounds, kit.L, model.num_blocks, m)
    if bounds is None:
        return INF, ()
    ranges = stage_ranges(kit.L, bounds)
    flat = kit.flat_zone
    reps = [Replica(g, t, flat) for g, t in stages]
    times = [c.fb(f, last) for c, (f, last) in zip(costs, ranges)]
    comm = [kit.p2p(mbs, reps[s], reps[s + 1]) for s in range(P - 1)]
    sync = max(kit.allreduce(c.grad_params(f, last), [r] * D) for c, r, (f, last) in zip(costs, reps, ranges))
    return pipeline_estimate(times, comm, m) + sync, bounds


def _fit_memory(costs, bounds, L: int, num_blocks: int, m: int):
    """Move blocks off stages that do not fit, one at a time, to the roomier neighbour."""
    P = len(costs)
    counts = [b - a for a, b in zip((1, *bounds), (*bounds, num_blocks + 1))]  # blocks per stage
    for _ in range(MAX_MOVES):
        ranges = stage_ranges(L, bounds_from_counts(counts))
        free = [c.capacity - c.memory(MEMORY, f, last, min(P - s, m))
                for s, (c, (f, last)) in enumerate(zip(costs, ranges))]
        over = [s for s in range(P) if free[s] < 0]
        if not over:
            return bounds_from_counts(counts)
        s = over[0]
        neighbours = [n for n in (s - 1, s + 1) if 0 <= n < P]
        if counts[s] <= 1 or not neighbours:
            return None
        target = max(neighbours, key=lambda n: free[n] / costs[n].capacity)
        counts[s] -= 1
        counts[target] += 1
    return None


def _plan(sim, global_batch, groups, stages, bounds, D, mbs, runtime):
    """Lay the pipelines on the GPUs: the stages of each type take that type's GPUs in rank order."""
    per_type: dict[str, list[int]] = {}
    for g, t in stages:
        per_type.setdefault(g, []).append(t)
    placed: dict[str, list] = {}
    for g, tps in per_type.items():
        reps = rank_order(groups[g], D, tps)
        if reps is None:
            return None
        placed[g] = reps
    replicas, seen = [], {g: 0 for g in per_type}
    for g, _ in stages:
        replicas.append(placed[g][seen[g]])
        seen[g] += 1
    candidate = make_plan(sim, global_batch, bounds, replicas, mbs, even_shares(global_batch, mbs, D), runtime)
    return candidate if fits_available(candidate, sim.cluster) else None
