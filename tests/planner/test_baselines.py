"""Baseline planners: valid plans on the GPUs given, each system's defining restriction, and our
planner at least as good as every one of them under the simulator."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from itertools import combinations

import pytest

from planner.baselines import BASELINES, run_baseline
from planner.baselines.common import (
    INF, balanced_shares, block_bounds, devices, fits_available, minmax_split, proportional_bounds, rank_order,
    stage_ranges,
)
from planner.errors import SailorError
from planner.profiles.store import ProfileStore
from planner.search.goal import Goal
from planner.search.planner import Planner
from planner.simulator.runtime_model import runtime_model
from planner.simulator.simulate import Simulator
from planner.specs.hardware import CATALOG, GIB, Cluster, Pool
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage

MODEL = get_model("opt-350m")
GBS = 64
CASES = {  # built-in estimated profiles: no data needed
    "homogeneous": [("A100-40", "us-central1-a", 16)],
    "heterogeneous": [("A100-40", "us-central1-a", 8), ("V100-16", "us-central1-a", 8)],
    "imbalanced": [("A100-40", "us-central1-a", 4), ("V100-16", "us-central1-a", 12)],
    "geo": [("A100-40", "us-central1-a", 8), ("A100-40", "us-west1-b", 8)],
}
RT = runtime_model("sailor")


def simulator(pools, model=MODEL, store=None, gpus=None) -> Simulator:
    cluster = Cluster(gpus=gpus or dict(CATALOG)).with_available(tuple(Pool(g, z, n) for g, z, n in pools))
    return Simulator(model, cluster, store or ProfileStore(gpus=dict(cluster.gpus)))


_RESULTS: dict = {}


def result(name: str, case: str):
    """Each (baseline, case) is planned once per session."""
    if (name, case) not in _RESULTS:
        sim = simulator(CASES[case])
        _RESULTS[(name, case)] = (sim, run_baseline(name, sim, GBS))
    return _RESULTS[(name, case)]


def blocks_per_stage(plan: Plan) -> list[int]:
    return [sum(1 for layer in s.layers if MODEL.kind(layer) == "block") for s in plan.stages]


# -- every baseline, every case -------------------------------------------------
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", BASELINES)
def test_baseline_returns_a_valid_plan_on_the_gpus_given(name, case):
    sim, r = result(name, case)
    plan = r.plan
    plan.check(MODEL.num_layers, sim.cluster)  # contiguous stages, D replicas each, shares sum to the batch
    assert plan.model == MODEL.name and plan.global_batch_size == GBS
    assert sum(p.microbatch_size * p.num_microbatches for p in plan.pipelines) == GBS
    assert all(len(s.replicas) == plan.dp for s in plan.stages)
    have = Counter()
    for g, z, n in CASES[case]:
        have[(g, z)] += n
    for pool, used in plan.gpus_used().items():
        assert used <= have[pool], f"{name} uses {used} GPUs of {pool}, {have[pool]} given"
    assert fits_available(plan, sim.cluster)
    assert math.isfinite(r.predicted_iteration_time_s) and r.predicted_iteration_time_s > 0
    assert r.search_time_s >= 0 and r.candidates >= 1
    est = sim.simulate(plan, RT)
    assert est.iteration_time_s > 0


@pytest.mark.parametrize("case", CASES)
def test_sailor_is_at_least_as_good_as_every_baseline(case):
    sim = simulator(CASES[case])
    ours = Planner(sim, GBS, Goal("throughput"), "sailor").run(top=1).plans[0][1]
    assert ours.fits_in_memory
    for name in BASELINES:
        theirs = sim.simulate(result(name, case)[1].plan, RT)
        if theirs.fits_in_memory:
            assert ours.iteration_time_s <= theirs.iteration_time_s * (1 + 1e-9), \
                f"{name} beats sailor on {case}: {theirs.iteration_time_s} s vs {ours.iteration_time_s} s"


# -- each system's defining restriction ----------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_megatron_is_uniform_on_one_gpu_type_and_uses_all_of_it(case):
    sim, r = result("megatron", case)
    plan = r.plan
    types = {rep.gpu for s in plan.stages for rep in s.replicas}
    assert len(types) == 1
    assert plan.num_gpus == sum(n for g, _, n in CASES[case] if g in types)  # TP x PP x DP = N
    assert len({rep.tp for s in plan.stages for rep in s.replicas}) == 1
    assert len(set(blocks_per_stage(plan))) == 1  # uniform split of the blocks
    assert plan.stages[0].first == 0 and MODEL.kind(plan.stages[0].last) == "block" or plan.pp == 1
    assert len(set(plan.pipelines)) == 1  # one microbatch size, even batch split


@pytest.mark.parametrize("case", CASES)
def test_varuna_has_no_tensor_parallelism(case):
    plan = result("varuna", case)[1].plan
    assert {rep.tp for s in plan.stages for rep in s.replicas} == {1}
    assert len({rep.gpu for s in plan.stages for rep in s.replicas}) == 1
    counts = blocks_per_stage(plan)
    assert max(counts) - min(counts) <= 1  # evenly spaced cut-points
    assert len({p.microbatch_size for p in plan.pipelines}) == 1
    assert max(p.num_microbatches for p in plan.pipelines) - min(p.num_microbatches for p in plan.pipelines) <= 1


@pytest.mark.parametrize("case", CASES)
def test_piper_stays_on_one_gpu_type_with_an_even_batch(case):
    plan = result("piper", case)[1].plan
    assert len({rep.gpu for s in plan.stages for rep in s.replicas}) == 1
    assert len(set(plan.pipelines)) == 1  # D divides the microbatches
    for s in plan.stages:  # one TP degree per stage (stages may differ)
        assert len({rep.tp for rep in s.replicas}) == 1


@pytest.mark.parametrize("case", CASES)
def test_amp_uses_every_gpu_given_with_uniform_stages(case):
    sim, r = result("amp", case)
    plan = r.plan
    assert plan.num_gpus == len(devices(sim.cluster))  # TP x PP x DP = N, all types and zones
    assert len({rep.tp for s in plan.stages for rep in s.replicas}) == 1
    assert len(set(plan.pipelines)) == 1
    # Megatron's rank order over the GPUs as given: stage s holds the s-th block of D*tp GPUs
    tp, D = plan.stages[0].replicas[0].tp, plan.dp
    expected = rank_order(devices(sim.cluster), D, [tp] * plan.pp)
    assert [list(s.replicas) for s in plan.stages] == expected


@pytest.mark.parametrize("case", CASES)
def test_metis_maps_types_to_stages_and_balances_batch_shares(case):
    sim, r = result("metis", case)
    plan = r.plan
    tp = plan.stages[0].replicas[0].tp
    assert {rep.tp for s in plan.stages for rep in s.replicas} == {tp}
    # stages are consecutive slices of the GPUs grouped by type (in some type order)
    types_in_order = [rep.gpu for s in plan.stages for rep in s.replicas]
    changes = sum(1 for a, b in zip(types_in_order, types_in_order[1:]) if a != b)
    assert changes <= len({g for g, _, _ in CASES[case]}) - 1
    # faster pipelines (every stage on a faster GPU) never get fewer microbatches
    speed = {"A100-40": 2, "V100-16": 1}
    kinds = [tuple(speed[s.replicas[k].gpu] for s in plan.stages) for k in range(plan.dp)]
    for a in range(plan.dp):
        for b in range(plan.dp):
            if all(x >= y for x, y in zip(kinds[a], kinds[b])):
                assert plan.pipelines[a].num_microbatches >= plan.pipelines[b].num_microbatches - 1


def test_metis_gives_slower_pipelines_fewer_microbatches():
    from planner.baselines import metis
    from planner.baselines.common import Toolkit

    sim = simulator([("A100-40", "us-central1-a", 8), ("V100-16", "us-central1-a", 8)])
    kit = Toolkit(sim, flat_zone="us-central1-a")
    # one stage, four replicas: two on A100s, two on V100s (a stage straddling the two types)
    a, v = Replica("A100-40", 4, "us-central1-a"), Replica("V100-16", 4, "us-central1-a")
    estimate, bounds, shares = metis._estimate(kit, [[a, a, v, v]], 2, 32)
    assert bounds == () and sum(shares) == 32
    assert shares[0] == shares[1] > shares[2] == shares[3]
    a100 = kit.costs("A100-40", 2, 4).fb(0, MODEL.num_layers - 1)
    v100 = kit.costs("V100-16", 2, 4).fb(0, MODEL.num_layers - 1)
    assert shares[0] / shares[2] == pytest.approx(v100 / a100, rel=0.25)  # in proportion to speed


@pytest.mark.parametrize("case", CASES)
def test_flashflex_puts_every_gpu_type_in_identical_pipelines(case):
    plan = result("flashflex", case)[1].plan
    given = {g for g, _, _ in CASES[case]}
    for s in plan.stages:  # identical pipelines: each stage one GPU type and TP
        assert len({(rep.gpu, rep.tp) for rep in s.replicas}) == 1
    assert {s.replicas[0].gpu for s in plan.stages} == given
    assert len(set(plan.pipelines)) <= 2 and max(p.num_microbatches for p in plan.pipelines) - min(
        p.num_microbatches for p in plan.pipelines) <= 1


@pytest.mark.parametrize("case", CASES)
def test_dtfm_is_pipeline_and_data_parallel_with_equal_stages(case):
    plan = result("dtfm", case)[1].plan
    assert {rep.tp for s in plan.stages for rep in s.replicas} == {1}
    assert len({rep.gpu for s in plan.stages for rep in s.replicas}) == 1
    counts = blocks_per_stage(plan)
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("pools", [CASES["geo"], [("A100-40", "us-central1-a", 6), ("A100-40", "us-central1-b", 6),
                                               ("A100-40", "us-west1-b", 4)]])
def test_dtfm_chains_stages_across_as_few_zone_boundaries_as_possible(pools):
    """Pipeline k is replica k of every stage: DTFM chains the stage groups so that as many
    consecutive replicas as the zone counts allow share a zone."""
    sim = simulator(pools)
    plan = run_baseline("dtfm", sim, GBS).plan
    for s in range(plan.pp - 1):
        here = Counter(r.zone for r in plan.stages[s].replicas)
        there = Counter(r.zone for r in plan.stages[s + 1].replicas)
        fewest = plan.dp - sum(min(here[z], there[z]) for z in here)
        crossing = sum(a.zone != b.zone for a, b in zip(plan.stages[s].replicas, plan.stages[s + 1].replicas))
        assert crossing == fewest


def test_dtfm_picks_the_placement_its_cost_model_prefers():
    from planner.baselines import dtfm
    from planner.baselines.common import Toolkit

    sim = simulator(CASES["geo"])
    plan = run_baseline("dtfm", sim, GBS).plan
    kit = Toolkit(sim)
    c = kit.costs("A100-40", plan.pipelines[0].microbatch_size, 1)
    grads = [c.grad_params(s.first, s.last) for s in plan.stages]
    zones = {z: n for _, z, n in CASES["geo"]}
    m, mbs = max(p.num_microbatches for p in plan.pipelines), plan.pipelines[0].microbatch_size
    chosen = dtfm._comm(kit, [list(s.replicas) for s in plan.stages], mbs, m, grads)
    for option in dtfm._placements("A100-40", zones, plan.pp, plan.dp):
        assert chosen <= dtfm._comm(kit, option, mbs, m, grads) + 1e-12


# -- cost models: what each one counts -------------------------------------------
def test_memory_blind_amp_still_answers_where_memory_aware_baselines_cannot():
    # A100s with 2 GiB: nothing of OPT-350 at this batch fits; AMP does not model memory
    tiny = replace(CATALOG["A100-40"], memory_bytes=2 * GIB)
    gpus = {**CATALOG, "A100-40": tiny}
    sim = simulator([("A100-40", "us-central1-a", 8)], gpus=gpus)
    plan = run_baseline("amp", sim, GBS).plan
    assert not sim.simulate(plan, RT).fits_in_memory
    for name in ("metis", "flashflex", "dtfm", "piper", "megatron"):
        with pytest.raises(SailorError, match=name):
            run_baseline(name, sim, GBS)


def test_varuna_counts_memory_as_if_activations_were_recomputed():
    from planner.baselines.common import MemoryView, Toolkit

    sim = simulator(CASES["homogeneous"])
    c = Toolkit(sim).costs("A100-40", 4, 1)
    full = c.memory(MemoryView.TENSORS, 1, 12, inflight=4)
    recompute = c.memory(MemoryView.RECOMPUTE, 1, 12, inflight=4)
    assert recompute < full
    exact = sim.simulate(Plan(MODEL.name, 16, (Stage(0, MODEL.num_layers - 1, (Replica("A100-40", 1, "z"),)),),
                              (Pipeline(4, 4),)), RT).peak_memory_bytes
    whole = c.memory(MemoryView.TENSORS, 0, MODEL.num_layers - 1, inflight=1)
    assert whole < exact  # tensors alone leave out the runtime's own memory


# -- bad input ----------------------------------------------------------------------
@pytest.mark.parametrize("name", BASELINES)
def test_bad_input_is_a_one_line_error(name):
    sim = simulator(CASES["homogeneous"])
    with pytest.raises(SailorError, match="global batch must be positive"):
        run_baseline(name, sim, 0)
    with pytest.raises(SailorError, match="no GPUs given"):
        run_baseline(name, simulator([]), GBS)


def test_unknown_baseline_is_a_clear_error():
    with pytest.raises(SailorError, match="unknown baseline 'galvatron'"):
        run_baseline("galvatron", simulator(CASES["homogeneous"]), GBS)


# -- shared helpers ---------------------------------------------------------------
def test_minmax_split_matches_brute_force():
    weights = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    L = len(weights)
    for P in range(1, L + 1):
        def cost(s, first, last):
            w = sum(weights[first:last + 1])
            return INF if (s == 0 and last - first > 3) else w + 0.5 * s

        brute = INF
        for cut in combinations(range(1, L), P - 1):
            ranges = stage_ranges(L, cut)
            brute = min(brute, max(cost(s, f, last) for s, (f, last) in enumerate(ranges)))
        found = minmax_split(L, P, cost)
        if brute == INF:
            assert found is None
        else:
            value, bounds = found
            assert value == pytest.approx(brute)
            assert max(cost(s, f, last) for s, (f, last) in enumerate(stage_ranges(L, bounds))) == pytest.approx(brute)


def test_block_splits():
    assert block_bounds(24, 4, strict=True) == (7, 13, 19)  # 6 blocks each, embedding and head at the ends
    assert block_bounds(24, 5, strict=True) is None
    assert block_bounds(24, 5) == (6, 11, 16, 21)  # 5,5,5,5,4
    assert block_bounds(24, 1) == ()
    b = proportional_bounds(24, [3.0, 1.0])
    assert b == (19,)  # 18 and 6 blocks
    assert proportional_bounds(24, [1.0] * 25) is None


def test_balanced_shares_follow_speed_and_sum_to_the_batch():
    shares = balanced_shares(64, 2, [2.0, 2.0, 1.0, 1.0])
    assert sum(shares) == 32 and shares[0] > shares[2] and shares[0] == shares[1]
    assert balanced_shares(8, 2, [1.0] * 5) is None  # more pipelines than microbatches
    assert min(balanced_shares(64, 1, [100.0, 1.0])) >= 1


def test_rank_order_keeps_tp_groups_inside_one_pool():
    devs = [("A100-40", "a")] * 6 + [("V100-16", "a")] * 2
    assert rank_order(devs, 2, [2, 2]) == [[Replica("A100-40", 2, "a")] * 2,
                                           [Replica("A100-40", 2, "a"), Replica("V100-16", 2, "a")]]
    assert rank_order(devs, 1, [4, 4]) is None  # the second TP group would span both types
    assert rank_order(devs, 3, [4]) is None  # too few GPUs


def test_fits_available_counts_nodes():
    sim = simulator([("A100-40", "us-central1-a", 6)])
    three = Plan(MODEL.name, 3, (Stage(0, 25, (Replica("A100-40", 2, "us-central1-a"),) * 3),), (Pipeline(1, 1),) * 3)
    assert fits_available(three, sim.cluster)  # 2 + 2 on one node, 2 on the partial one
    four = replace(three, stages=(Stage(0, 25, (Replica("A100-40", 2, "us-central1-a"),) * 4),),
                   pipelines=(Pipeline(1, 1),) * 4, global_batch_size=4)
    assert not fits_available(four, sim.cluster)


# -- on Sailor's published profiles ---------------------------------------------------
@pytest.mark.parametrize("pools, gbs", [([("A100-40", "us-central1-a", 32)], 1024),
                                        ([("A100-40", "us-central1-a", 16), ("V100-16", "us-central1-a", 16)], 1024)])
def test_on_measured_profiles_every_baseline_is_valid_and_sailor_wins(sailor_data, pools, gbs):
    from planner.profiles.store import load_profiles

    store = load_profiles([str(sailor_data)], model=MODEL.name)
    sim = simulator(pools, store=store)
    ours = Planner(sim, gbs, Goal("throughput"), "sailor").run(top=1).plans[0][1]
    for name in BASELINES:
        plan = run_baseline(name, sim, gbs).plan
        plan.check(MODEL.num_layers, sim.cluster)
        assert fits_available(plan, sim.cluster)
        theirs = sim.simulate(plan, RT)
        if theirs.fits_in_memory:
            assert ours.iteration_time_s <= theirs.iteration_time_s * (1 + 1e-9), name
