"""Several chains side by side: a plan's replicas rearranged over its zones, stage by stage.

The search's designs keep every stage's gradient ring inside one zone (chains)
or let pipelines fill zones whole (single pool: each pipeline in one zone,
every ring over all of them). Where the measured links between zones are
faster than some inside a zone, a third arrangement of the same replicas is
faster: stage-major, zones in some order z_1, z_2, ..., the slots of stage 0
first, then those of stage 1, and so on:

    replica k of stage s  ->  slot s*D + k  of  [z_1 x n_1, z_2 x n_2, ...]

with n_z the plan's replicas in zone z. Pipelines then run side by side
through different chains of zones (a->c and b->f on 4 x 128 A100 in
us-central1), and a stage's ring spans only the zones its slots fall in. The
plan keeps its GPUs per zone, layers, TP degrees and microbatches; only its
time and egress change, and the simulator judges them.

This is a pass over the search's best plans, not part of the exact branch and
bound: for a plan on one GPU type and TP degree whose pipelines span zones,
every order of its zones when there are at most EXHAUSTIVE_ZONES, else a
descent over swaps of two zones from the plan's own order; the plan is
replaced only by an arrangement that the simulator finds better and that
keeps every promise (verify.py).
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

from planner.search.goal import Goal
from planner.search.space import zone_classes
from planner.search.verify import broken_promises
from planner.simulator.runtime_model import RuntimeModel
from planner.simulator.simulate import Simulator
from planner.specs.plan import Plan

EXHAUSTIVE_ZONES = 3  # 6 orders at most; beyond, a descent over swaps


def stage_major(plan: Plan, order: tuple[str, ...]) -> Plan:
    """The plan with replica k of stage s in the zone of slot s*D + k (zones in `order`, each as often
    as the plan uses it)."""
    used = Counter(r.zone for st in plan.stages for r in st.replicas)
    one = plan.stages[0].replicas[0]  # every replica is of one GPU type and TP degree (rearrangeable)
    in_zone = {z: replace(one, zone=z) for z in order}
    slots = [in_zone[z] for z in order for _ in range(used[z])]
    D = plan.dp
    stages = tuple(replace(st, replicas=tuple(slots[s * D:(s + 1) * D])) for s, st in enumerate(plan.stages))
    return replace(plan, stages=stages)


def rearrangeable(plan: Plan) -> bool:
    """Several stages, one GPU type and TP degree, and more than one zone."""
    reps = [r for st in plan.stages for r in st.replicas]
    return plan.pp > 1 and len({(r.gpu, r.tp) for r in reps}) == 1 and len({r.zone for r in reps}) > 1


def interchangeable(plan: Plan, zones: tuple[str, ...], sim: Simulator) -> dict[str, str]:
    """zone -> the first of `zones` it is interchangeable with for this plan's GPU type (space.zone_classes):
    swapping two such zones everywhere in an arrangement changes nothing the simulator or the plan's
    promises read."""
    classes = zone_classes(sim.cluster, sim.network.fits.inter, zones, plan.stages[0].replicas[0].gpu)
    return {z: c[0] for c in classes for z in c}


def rearrange(plan: Plan, est, sim: Simulator, rt: RuntimeModel, goal: Goal):
    """(plan, estimate): the best of the plan and its stage-major arrangements under `goal`."""
    if not rearrangeable(plan):
        return plan, est
    zones = tuple(dict.fromkeys(st.replicas[k].zone for k in range(plan.dp) for st in plan.stages))  # plan's order
    used = Counter(r.zone for st in plan.stages for r in st.replicas)
    first = interchangeable(plan, zones, sim)
    scores: dict = {}  # arrangement -> (score, plan, estimate)

    def score(order: tuple[str, ...]) -> float:
        # orders that differ by swapping interchangeable zones of equal use are one arrangement, simulated once
        key = tuple((first[z], used[z]) for z in order)
        if key not in scores:
            cand = stage_major(plan, order)
            e = sim.simulate(cand, rt)
            scores[key] = (goal.score_estimate(e) if e.fits_in_memory else float("inf"), cand, e)
        return scores[key][0]

    if len(zones) <= EXHAUSTIVE_ZONES:
        for order in itertools.permutations(zones):
            score(order)
    else:  # steepest descent over swaps of two zones
        cur, cur_score = zones, score(zones)
        while True:
            swaps = []
            for i, j in itertools.combinations(range(len(cur)), 2):
                o = list(cur)
                o[i], o[j] = o[j], o[i]
                swaps.append((score(tuple(o)), tuple(o)))
            nxt_score, nxt = min(swaps)
            if nxt_score >= cur_score:
                break
            cur, cur_score = nxt, nxt_score
    base = goal.score_estimate(est)
    for s, cand, e in sorted(scores.values(), key=lambda x: x[0]):
        if s >= base:
            break
        if not broken_promises(cand, e, goal, sim.cluster):  # limits, nodes per pool, quotas
            return cand, e
    return plan, est
