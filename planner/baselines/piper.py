"""Piper-style planning: a two-level dynamic program over layers and devices, on one GPU type.

Piper (NeurIPS'21) splits the layers into contiguous stages with a dynamic
program over (layer suffix, devices left), choosing each stage's
tensor-parallel degree and data-parallel width in an inner level, to minimise
the time per batch of the bottleneck stage.

Rules, in our search space:
  * one GPU type (zones ignored; GPUs mapped in Megatron's rank order);
  * every stage has the same number of replicas D (our plans need it; Piper
    lets each stage have its own), but its own TP degree;
  * D divides the number of microbatches (Piper splits the batch evenly);
  * any contiguous split of the layers, up to MAX_STAGES stages.

Cost model (Piper's): a stage's load is the time it is busy per batch, m
microbatches of forward + backward with its p2p sends, plus the all-reduce
of its gradients over the D replicas; the plan's time is the largest load.
The pipeline's fill and drain (the bubble) and the optimizer step are not
counted. Memory is checked with MemoryView.TENSORS: weights, gradients and
optimizer state, and the activations of the microbatches in flight under 1F1B,
but not the runtime's own memory.

Outer level: every (GPU type, microbatch size, D) with D | microbatches; inner
level: for each, the exact (load, GPUs) Pareto frontier over splits and TP
degrees, so the best plan within the GPUs given is found. Ties go to fewer GPUs.
"""
from __future__ import annotations

import math

from planner.baselines.common import (
    INF, BaselineResult, MemoryView, Toolkit, by_type, check_inputs, devices, even_shares, fits_available,
    make_plan, rank_order, timed,
)
from planner.errors import SailorError
from planner.simulator.simulate import Simulator
from planner.specs.plan import Replica

NAME = "piper"
MEMORY = MemoryView.TENSORS
MAX_STAGES = 8


@timed
def plan(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """The plan with the smallest Piper load (bottleneck stage time per batch)."""
    check_inputs(NAME, sim, global_batch)
    devs_all = devices(sim.cluster)
    kit = Toolkit(sim, runtime, flat_zone=devs_all[0][1])
    best, looked = None, 0
    for gpu, devs in by_type(devs_all).items():
        N = len(devs)
        for mbs in sorted({b for b, _ in kit.configs(gpu)}):
            if global_batch % mbs:
                continue
            M = global_batch // mbs
            tps = [t for b, t in kit.configs(gpu) if b == mbs]
            for D in (d for d in range(1, min(M, N) + 1) if M % d == 0):
                budget = N // D  # GPUs each pipeline may take
                if budget < 1:
                    continue
                looked += 1
                for load, gpus, bounds, stage_tps in _frontier(kit, gpu, mbs, tps, D, M // D, budget):
                    key = (load, gpus * D)
                    if best is not None and key >= best[0]:
                        continue
                    replicas = rank_order(devs, D, list(stage_tps))
                    if replicas is None:
                        continue
                    candidate = make_plan(sim, global_batch, bounds, replicas, mbs, even_shares(global_batch, mbs, D),
                                          runtime)
                    if fits_available(candidate, sim.cluster):
                        best = (key, candidate)
    if best is None:
        raise SailorError(f"{NAME}: no split of the model into at most {MAX_STAGES} stages fits in memory on the "
                          "GPUs given")
    return BaselineResult(NAME, best[1], best[0][0], math.nan, looked)


def _frontier(kit: Toolkit, gpu: str, mbs: int, tps: list[int], D: int, m: int, budget: int):
    """(load, GPUs per pipeline, bounds, TP per stage) on the Pareto frontier, for every stage count.

    table[r][j]: frontier of layers j..L-1 in r+1 stages, the first of which has
    a stage before it unless j == 0 (it sends to / receives from it).
    """
    L = kit.L
    rep = {t: Replica(gpu, t, kit.flat_zone) for t in tps}
    costs = {t: kit.costs(gpu, mbs, t) for t in tps}
    c = {t: kit.p2p(mbs, rep[t], rep[t]) for t in tps}
    ring = {t: [rep[t]] * D for t in tps}
    sync_cache: dict = {}

    def load(j: int, i: int, t: int, r: int) -> float:
        """Busy seconds per batch of a stage on layers j..i-1 with TP t and r stages after it."""
        cs = costs[t]
        if not cs.fits(MEMORY, j, i - 1, min(r + 1, m)):
            return INF
        sends = (j > 0) + (r > 0)
        key = (j, i, t)
        if key not in sync_cache:
            sync_cache[key] = kit.allreduce(cs.grad_params(j, i - 1), ring[t])
        return m * (cs.fb(j, i - 1) + 2 * c[t] * sends) + sync_cache[key]

    max_r = min(MAX_STAGES, L, budget) - 1
    table: list[dict[int, list]] = [dict() for _ in range(max_r + 1)]
    for r in range(max_r + 1):
        for j in range(L - r - 1, -1, -1):
            cell = []
            for i in ([L] if r == 0 else range(j + 1, L - r + 1)):
                rest = [(0.0, 0, (), ())] if r == 0 else table[r - 1].get(i, [])
                if not rest:
                    continue
                for t in tps:
                    own = load(j, i, t, r)
                    if own == INF:
                        continue
                    for l2, g2, b2, t2 in rest:
                        g = t + g2
                        if g <= budget:
                            cell.append((own if own > l2 else l2, g, (i, *b2) if r else (), (t, *t2)))
            if cell:
                table[r][j] = _pareto(cell)
    for r in range(max_r + 1):
        for load_, gpus, bounds, stage_tps in table[r].get(0, []):
            yield load_, gpus, bounds, stage_tps


def _pareto(cell: list) -> list:
    """Keep the entries that no other beats in both load and GPUs."""
    cell.sort(key=lambda e: (e[0], e[1]))
    out, fewest = [], math.inf
    for e in cell:
        if e[1] < fewest:
            out.append(e)
            fewest = e[1]
    return out
