"""AMP-style planning: uniform 3D parallelism over heterogeneous GPUs, with a heterogeneity-aware layer split.

AMP (NeurIPS'22) enumerates uniform (TP, PP, DP) configurations over all the
devices of a cluster, maps ranks to devices in Megatron's order, and models
that the devices (and links) of each stage may differ: its layer partition
balances stages by the speed of the devices they landed on.

Rules:
  * all GPUs given, every type and zone, in the order given: TP x PP x DP = N;
    the GPU types land on stages where Megatron's rank order puts them (a
    stage may hold replicas of two types);
  * one TP degree and one DP width for every stage ("uniform stages"), one
    microbatch size, the batch split evenly (DP x mbs divides it);
  * any contiguous layer split, chosen to minimise the slowest stage, where a
    stage's time is that of its slowest replica.

Cost model (AMP's): T = sum_s t_s + (m - 1) max_s t_s + 2 sum of p2p + the
slowest stage's ring all-reduce, with the measured bandwidth of the links the
ranks landed on (zones included). AMP does not model memory at all
(MemoryView.NONE), so it can pick plans that do not fit.
"""
from __future__ import annotations

import math

from planner.baselines.common import (
    INF, BaselineResult, MemoryView, Toolkit, check_inputs, devices, fits_available, make_plan, minmax_split,
    pipeline_estimate, stage_ranges, timed, uniform_layouts,
)
from planner.errors import SailorError
from planner.simulator.simulate import Simulator

NAME = "amp"
MEMORY = MemoryView.NONE
MAX_STAGES = 16


@timed
def plan(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """The uniform (TP, PP, DP, microbatch size) with the lowest AMP estimate."""
    check_inputs(NAME, sim, global_batch)
    devs = devices(sim.cluster)
    kit = Toolkit(sim, runtime)
    N, L = len(devs), sim.model.num_layers
    types = sorted({g for g, _ in devs})
    common = set.intersection(*(set(kit.configs(g)) for g in types))
    best, looked = None, 0
    for mbs, tp, P, D, replicas in uniform_layouts(devs, sorted(common), range(1, min(MAX_STAGES, L) + 1),
                                                   global_batch):
        looked += 1
        m = global_batch // (D * mbs)
        estimate, bounds = _estimate(kit, replicas, mbs, m)
        if estimate < INF and (best is None or estimate < best[0]):
            candidate = make_plan(sim, global_batch, bounds, replicas, mbs, [m] * D, runtime)
            if fits_available(candidate, sim.cluster):
                best = (estimate, candidate)
    if best is None:
        raise SailorError(f"{NAME}: no uniform TP x PP x DP configuration splits the {N} GPUs given and the "
                          f"global batch {global_batch} evenly")
    return BaselineResult(NAME, best[1], best[0], math.nan, looked)


def _estimate(kit: Toolkit, replicas, mbs: int, m: int):
    """AMP's time of a mapped configuration with its best (min-max) layer split."""
    P = len(replicas)
    stage_types = [sorted({r.gpu for r in stage}) for stage in replicas]
    tp = replicas[0][0].tp
    costs = {g: kit.costs(g, mbs, tp) for g in {g for ts in stage_types for g in ts}}

    def stage_time(s: int, first: int, last: int) -> float:
        return max(costs[g].fb(first, last) for g in stage_types[s])

    found = minmax_split(kit.L, P, stage_time)
    if found is None:
        return INF, ()
    _, bounds = found
    ranges = stage_ranges(kit.L, bounds)
    times = [stage_time(s, f, last) for s, (f, last) in enumerate(ranges)]
    comm = [max(kit.p2p(mbs, a, b) for a, b in set(zip(replicas[s], replicas[s + 1]))) for s in range(P - 1)]
    sync = max(kit.allreduce(costs[stage_types[s][0]].grad_params(f, last), replicas[s])
               for s, (f, last) in enumerate(ranges))
    return pipeline_estimate(times, comm, m) + sync, bounds
