"""DTFM-style planning: pipeline and data parallelism placed across zones by a communication cost model.

DTFM ("Decentralized Training of Foundation Models in Heterogeneous
Environments", NeurIPS'22) trains over GPUs of one kind spread over slow,
uneven networks. The model is cut into equal stages; the devices are split
into one data-parallel group per stage and the groups are chained into
pipelines, choosing both so that gradient all-reduces and pipeline transfers
avoid the slow links (DTFM searches this with a genetic algorithm over a
communication cost model).

Rules:
  * one GPU type; TP 1; P stages with the transformer blocks split evenly
    (embedding first, head last); D = N // P pipelines (fewer if the nodes
    cannot hold them); one microbatch size, the batch split evenly;
  * placement (the part DTFM optimises), at the granularity of zones: which
    zones each stage's data-parallel group draws its D GPUs from. Candidates:
      - zone blocks: the GPUs in some zone order, stage s taking the next D
        (every order of up to MAX_ZONE_ORDERS zone orders: the order also
        decides which stage boundaries cross which zones);
      - pipeline-local: every pipeline inside one zone (groups span zones,
        p2p never leaves a zone);
  * no memory planning beyond a check with MemoryView.TENSORS.

Cost model (DTFM's, compute included): the 1F1B time of the equal stages +
every microbatch's p2p (m x 2 x the slowest pair of each boundary, not
overlapped) + the slowest group's ring all-reduce over its links.
"""
from __future__ import annotations

import math
from itertools import islice, permutations

from planner.baselines.common import (
    BaselineResult, MemoryView, Toolkit, block_bounds, by_type, check_inputs, devices, even_shares,
    fits_available, make_plan, most_pipelines, pipeline_estimate, stage_ranges, timed,
)
from planner.errors import SailorError
from planner.simulator.simulate import Simulator
from planner.specs.plan import Replica

NAME = "dtfm"
MEMORY = MemoryView.TENSORS
MAX_ZONE_ORDERS = 120


@timed
def plan(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """The (P, microbatch size, placement) with the lowest DTFM estimate, TP 1, on one GPU type."""
    check_inputs(NAME, sim, global_batch)
    kit = Toolkit(sim, runtime)  # zone-aware: placement across zones is what DTFM optimises
    model, L = sim.model, sim.model.num_layers
    best, looked = None, 0
    for gpu, devs in by_type(devices(sim.cluster)).items():
        zones: dict[str, int] = {}
        for _, z in devs:
            zones[z] = zones.get(z, 0) + 1
        sizes = [b for b, t in kit.configs(gpu) if t == 1 and global_batch % b == 0]
        if not sizes:
            continue
        for P in range(1, min(model.num_blocks, len(devs)) + 1):
            bounds = block_bounds(model.num_blocks, P)
            ranges = stage_ranges(L, bounds)
            d_max = most_pipelines(sim, devs, [1] * P, len(devs) // P)
            for mbs in sizes:
                D = min(d_max, global_batch // mbs)
                shares = even_shares(global_batch, mbs, D) if D else None
                if shares is None:
                    continue
                c = kit.costs(gpu, mbs, 1)
                m = max(shares)
                if not all(c.fits(MEMORY, f, last, min(P - s, m)) for s, (f, last) in enumerate(ranges)):
                    continue
                compute = pipeline_estimate([c.fb(f, last) for f, last in ranges], [0.0] * (P - 1), m)
                grads = [c.grad_params(f, last) for f, last in ranges]
                for replicas in _placements(gpu, zones, P, D):
                    looked += 1
                    estimate = compute + _comm(kit, replicas, mbs, m, grads)
                    if best is not None and estimate >= best[0]:
                        continue
                    candidate = make_plan(sim, global_batch, bounds, replicas, mbs, shares, runtime)
                    if fits_available(candidate, sim.cluster):
                        best = (estimate, candidate)
    if best is None:
        raise SailorError(f"{NAME}: no pipeline of equal stages fits the model in memory without tensor "
                          "parallelism on the GPUs given")
    return BaselineResult(NAME, best[1], best[0], math.nan, looked)


def _placements(gpu: str, zones: dict[str, int], P: int, D: int):
    """Candidate zone assignments: replicas[s][k] for zone blocks in several orders, and pipeline-local."""
    seen = set()
    for order in islice(permutations(zones), MAX_ZONE_ORDERS):
        pool = [z for z in order for _ in range(zones[z])]
        if len(pool) < P * D:
            continue
        replicas = _chained([[Replica(gpu, 1, z) for z in pool[s * D:(s + 1) * D]] for s in range(P)])
        key = tuple(map(tuple, replicas))
        if key not in seen:
            seen.add(key)
            yield replicas
    # pipeline-local: each zone hosts whole pipelines, zones in the order given
    local, left = [], D
    for z, n in zones.items():
        k = min(n // P, left)
        local += [z] * k
        left -= k
    if not left:
        replicas = [[Replica(gpu, 1, z) for z in local] for _ in range(P)]
        if tuple(map(tuple, replicas)) not in seen:
            yield replicas


def _comm(kit: Toolkit, replicas, mbs: int, m: int, grads: list[int]) -> float:
    """DTFM's communication cost: every microbatch's p2p at each boundary's slowest pair, plus the
    slowest data-parallel group's all-reduce. Pairs are matched zone to zone where they can be."""
    P = len(replicas)
    p2p = 0.0
    for s in range(P - 1):
        p2p += 2 * m * max(kit.p2p(mbs, a, b) for a, b in set(zip(replicas[s], replicas[s + 1])))
    sync = max(kit.allreduce(g, replicas[s]) for s, g in enumerate(grads))
    return p2p + sync


def _chained(stages: list[list[Replica]]) -> list[list[Replica]]:
    """Reorder each stage's replicas so that replica k of stage s+1 sits in the zone of replica k of
    stage s wherever it can (pipeline k is replica k of every stage): DTFM's chaining of groups."""
    out = [stages[0]]
    for nxt in stages[1:]:
        free: dict[str, list[Replica]] = {}
        for r in nxt:
            free.setdefault(r.zone, []).append(r)
        row: list = [free[r.zone].pop() if free.get(r.zone) else None for r in out[-1]]
        rest = [r for rs in free.values() for r in rs]
        out.append([r if r is not None else rest.pop(0) for r in row])
    return out
