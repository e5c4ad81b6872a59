"""Metis-style planning: GPU types mapped to stages, layers and batch balanced across them.

Metis (ATC'24) plans over heterogeneous GPUs: it orders the device groups of
each GPU type into pipeline stages, balances the layers across stages by
their measured speed, and balances data-parallel batch shares across replicas
of different speed. It plans for the GPUs it is given and does not look at
zones.

Rules:
  * all GPUs given, grouped by type; the types are laid out in some order
    (every order is tried) and cut into P equal device groups, one per stage,
    so a stage holds one type, or two where the cut falls inside a type;
    D = N // (TP x P) replicas per stage, in Megatron's rank order;
  * one TP degree and microbatch size for the plan;
  * any contiguous layer split, chosen to minimise the slowest stage (a
    stage's time is its slowest replica's), each stage fitting in memory;
  * balanced batch shares: pipeline k gets microbatches in proportion to its
    speed (1 / its bottleneck stage time), so pipelines through slower GPUs
    take fewer samples;
  * zones are ignored (a flat network in the cost model).

Cost model: T = max over pipelines of the 1F1B estimate (its own stage times,
its own microbatch count) + the slowest stage's ring all-reduce. Memory is
checked per replica with MemoryView.TENSORS (weights, gradients, optimizer
state and in-flight activations, no runtime overhead).
"""
from __future__ import annotations

import math
from itertools import permutations

from planner.baselines.common import (
    INF, BaselineResult, MemoryView, Toolkit, balanced_shares, by_type, check_inputs, devices, fits_available,
    make_plan, minmax_split, pipeline_estimate, rank_order, stage_ranges, timed,
)
from planner.errors import SailorError
from planner.simulator.simulate import Simulator

NAME = "metis"
MEMORY = MemoryView.TENSORS
MAX_STAGES = 8


@timed
def plan(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """The (type order, TP, PP, microbatch size) with the lowest Metis estimate."""
    check_inputs(NAME, sim, global_batch)
    given = devices(sim.cluster)
    kit = Toolkit(sim, runtime, flat_zone=given[0][1])
    groups = by_type(given)
    N, L = len(given), sim.model.num_layers
    common = set.intersection(*(set(kit.configs(g)) for g in groups))
    best, looked = None, 0
    for order in permutations(groups):
        devs = [d for g in order for d in groups[g]]
        for mbs, tp in sorted(common):
            if global_batch % mbs:
                continue
            M = global_batch // mbs
            for P in range(1, min(MAX_STAGES, L) + 1):
                D = min(N // (tp * P), M)
                if D < 1:
                    continue
                replicas = rank_order(devs, D, [tp] * P)
                if replicas is None:
                    continue
                looked += 1
                estimate, bounds, shares = _estimate(kit, replicas, mbs, M)
                if estimate < INF and (best is None or estimate < best[0]):
                    candidate = make_plan(sim, global_batch, bounds, replicas, mbs, shares, runtime)
                    if fits_available(candidate, sim.cluster):
                        best = (estimate, candidate)
    if best is None:
        raise SailorError(f"{NAME}: no stage layout of the GPUs given fits the model in memory")
    return BaselineResult(NAME, best[1], best[0], math.nan, looked)


def _estimate(kit: Toolkit, replicas, mbs: int, M: int):
    """Metis's time, its layer split and the balanced microbatch counts of a mapped configuration."""
    P, D = len(replicas), len(replicas[0])
    tp = replicas[0][0].tp
    stage_types = [sorted({r.gpu for r in stage}) for stage in replicas]
    costs = {g: kit.costs(g, mbs, tp) for ts in stage_types for g in ts}
    m_even = math.ceil(M / D)

    def stage_time(s: int, first: int, last: int) -> float:
        if not all(costs[g].fits(MEMORY, first, last, min(P - s, m_even)) for g in stage_types[s]):
            return INF
        return max(costs[g].fb(first, last) for g in stage_types[s])

    found = minmax_split(kit.L, P, stage_time)
    if found is None:
        return INF, (), []
    bounds = found[1]
    ranges = stage_ranges(kit.L, bounds)
    kinds = [tuple(replicas[s][k].gpu for s in range(P)) for k in range(D)]  # GPU type of each stage, per pipeline
    times = {kind: [costs[g].fb(f, last) for g, (f, last) in zip(kind, ranges)] for kind in set(kinds)}
    shares = balanced_shares(M * mbs, mbs, [1.0 / max(times[kind]) for kind in kinds])
    if shares is None:
        return INF, (), []
    for k, kind in enumerate(kinds):
        if not all(costs[g].fits(MEMORY, f, last, min(P - s, shares[k]))
                   for s, (g, (f, last)) in enumerate(zip(kind, ranges))):
            return INF, (), []
    comm = [max(kit.p2p(mbs, a, b) for a, b in set(zip(replicas[s], replicas[s + 1]))) for s in range(P - 1)]
    pipelines = max(pipeline_estimate(times[kind], comm, shares[k]) for k, kind in enumerate(kinds))
    sync = max(kit.allreduce(costs[stage_types[s][0]].grad_params(f, last), replicas[s])
               for s, (f, last) in enumerate(ranges))
    return pipelines + sync, bounds, shares
