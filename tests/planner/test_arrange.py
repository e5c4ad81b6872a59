"""Several chains side by side (planner/search/arrange.py): a plan's replicas stage by stage over its zones."""
from __future__ import annotations

import json
from collections import Counter

from planner.baselines import run_baseline
from planner.search import arrange
from planner.search.arrange import interchangeable, rearrangeable, stage_major
from planner.search.goal import Goal
from planner.search.planner import Planner
from planner.simulator.runtime_model import runtime_model
from planner.simulator.simulate import Simulator
from planner.specs.hardware import Cluster, Pool
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage, plan_from_sailor

MODEL = get_model("opt-350m")
RT = runtime_model("sailor")
CENTRAL = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")


def test_stage_major_fills_stage_by_stage_in_the_order_given():
    """2 stages x 4 pipelines, two whole pipelines in each of zones a and b: in the order (b, a) the slots
    are [b, b, b, b, a, a, a, a], stage 0 takes the first four, stage 1 the rest (worked by hand)."""
    a, b = (Replica("A100-40", 2, z) for z in ("za", "zb"))
    plan = Plan(MODEL.name, 8, (Stage(0, 12, (a, a, b, b)), Stage(13, 25, (a, a, b, b))), (Pipeline(1, 2),) * 4)
    assert rearrangeable(plan)
    out = stage_major(plan, ("zb", "za"))
    assert [r.zone for r in out.stages[0].replicas] == ["zb"] * 4
    assert [r.zone for r in out.stages[1].replicas] == ["za"] * 4
    assert [(s.first, s.last) for s in out.stages] == [(0, 12), (13, 25)] and out.pipelines == plan.pipelines
    mixed = Plan(MODEL.name, 6, (Stage(0, 12, (a, a, b)), Stage(13, 25, (a, a, b))), (Pipeline(1, 2),) * 3)
    out = stage_major(mixed, ("za", "zb"))  # slots [a, a, a, a, b, b]: pipeline 0 runs a -> a, 1 a -> b, 2 a -> b
    assert [[r.zone for r in s.replicas] for s in out.stages] == [["za"] * 3, ["za", "zb", "zb"]]
    one_stage = Plan(MODEL.name, 2, (Stage(0, 25, (a, b)),), (Pipeline(1, 1),) * 2)
    assert not rearrangeable(one_stage) and not rearrangeable(replace_zone(plan, "za"))


def replace_zone(plan: Plan, zone: str) -> Plan:
    from dataclasses import replace

    return replace(plan, stages=tuple(replace(s, replicas=tuple(replace(r, zone=zone) for r in s.replicas))
                                      for s in plan.stages))


def test_on_four_zones_our_pick_runs_chains_side_by_side_and_beats_every_uniform_arrangement(sailor_data):
    """4 x 128 A100-40 in us-central1 (Sailor's profiles and measured links, where some links between zones
    are faster than inside one): without the pass, Megatron's uniform plan (pipelines a->c and b->f) beats
    the search's pick; with it, our pick is at least as fast as Megatron's and Sailor's own, and its
    stage rings each span fewer zones than the four a zone-filling plan's rings cross."""
    from planner.profiles.store import load_profiles

    store = load_profiles([str(sailor_data)], model=MODEL.name)
    cluster = Cluster().with_available(tuple(Pool("A100-40", z, 128) for z in CENTRAL))
    sim = Simulator(MODEL, cluster, store)
    searched = Planner(sim, 1024, Goal(), "sailor", arrange=False).run().plans[0][1]
    plan, est = Planner(sim, 1024, Goal(), "sailor").run().plans[0]
    megatron = sim.simulate(run_baseline("megatron", sim, 1024, "sailor").plan, RT)
    assert megatron.iteration_time_s < searched.iteration_time_s  # the gap this pass closes
    assert est.iteration_time_s <= megatron.iteration_time_s
    anchor = json.loads((sailor_data / "anchor-plans" / "geo4z_N512.json").read_text())
    theirs = sim.simulate(plan_from_sailor(anchor, "geo4z_N512", MODEL.name), RT)  # Sailor's own pick
    assert est.iteration_time_s <= theirs.iteration_time_s
    assert max(len({r.zone for r in s.replicas}) for s in plan.stages) < len(CENTRAL)
    assert Counter(r.zone for s in plan.stages for r in s.replicas) == Counter(
        {z: 128 // plan.stages[0].replicas[0].tp for z in CENTRAL})  # the same GPUs per zone


def _h100_plan(counts: dict[str, int]) -> Plan:
    """2 stages of H100s (no measured profile or links: estimated; no Sailor data needed); replicas per zone."""
    reps = tuple(Replica("H100-80", 1, z) for z, n in counts.items() for _ in range(n))
    return Plan(MODEL.name, 2 * len(reps), (Stage(0, 12, reps), Stage(13, 25, reps)), (Pipeline(1, 2),) * len(reps))


def test_zones_a_swap_cannot_tell_apart_are_simulated_once(monkeypatch):
    """Two zones in each of two regions, the same H100s at the same price, no measured links: the zones of
    a region are interchangeable, so orders that differ by swapping two of them (of equal use) are one
    arrangement. The pass simulates fewer orders and returns exactly what simulating every order
    returns: here the pipelines stay inside a region (worked out by the simulator, 2.5x faster)."""
    from planner.profiles.network_fits import BandwidthFit, NetworkFits
    from planner.profiles.store import ProfileStore

    ca, wa, cb, wb = zones = ("us-central1-a", "us-west1-a", "us-central1-b", "us-west1-b")
    plan = _h100_plan(dict.fromkeys(zones, 2))

    def sim_of(cluster=Cluster(), fits=None):
        return Simulator(MODEL, cluster.with_available(tuple(Pool("H100-80", z, 8) for z in zones)),
                         ProfileStore(network=fits))

    sim = sim_of()
    assert interchangeable(plan, zones, sim) == {ca: ca, cb: ca, wa: wa, wb: wa}
    assert interchangeable(plan, zones, sim_of(Cluster(quotas={cb: 64}))) == {ca: ca, cb: cb, wa: wa, wb: wa}
    # egress alike everywhere: the region still tells the links apart (a zone's are not another region's)
    flat = Cluster(egress={(a, b): 0.01 for a in zones for b in zones if a != b})
    assert interchangeable(plan, zones, sim_of(flat)) == {ca: ca, cb: ca, wa: wa, wb: wa}
    pricier = Cluster(prices={("H100-80", wb): 99.0})
    assert interchangeable(plan, zones, sim_of(pricier)) == {ca: ca, cb: ca, wa: wa, wb: wb}
    # a measured link a -> b only: a swap of the two would need one b -> a
    link = NetworkFits(inter={(ca, "H100-80", 1, cb, "H100-80", 1): BandwidthFit(1.0, 0.0, 0.0, 1e9)})
    assert interchangeable(plan, zones, sim_of(fits=link)) == {ca: ca, cb: cb, wa: wa, wb: wa}

    calls = []
    simulate = Simulator.simulate
    monkeypatch.setattr(Simulator, "simulate", lambda self, p, rt=None: calls.append(p) or simulate(self, p, rt))
    est = simulate(sim, plan, RT)
    got = arrange.rearrange(plan, est, sim, RT, Goal())
    assert got[0] != plan and got[1].iteration_time_s < est.iteration_time_s / 2.5
    deduplicated = len(calls)
    monkeypatch.setattr(arrange, "interchangeable", lambda p, zs, s: {z: z for z in zs})  # every order apart
    calls.clear()
    assert arrange.rearrange(plan, est, sim, RT, Goal()) == got
    assert deduplicated < len(calls)
