"""Simulator formulas on small hand-checked cases."""
import math

import pytest

from planner.errors import SailorError
from planner.profiles.profile import MEASURED, LayerMemory, LayerTimes, Profile
from planner.profiles.store import ProfileStore
from planner.simulator.network import LATENCY_S, RING_EFFICIENCY, WAN_GBPS
from planner.simulator.simulate import Simulator
from planner.specs.hardware import CATALOG, GIB, Cluster
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage

MODEL = get_model("tiny")  # 6 layers
N = MODEL.num_layers
PARAMS, ACT, OUT = 1000, 1e5, 1e6  # per layer: parameters, activation bytes/sample, output bytes/sample


def store(gpu="A100-40", fwd=1e-3, bwd=2e-3, mbs=(2,), tps=(1, 4)):
    times = {(b, t): LayerTimes((fwd,) * N, (bwd,) * N) for b in mbs for t in tps}
    mem = {t: LayerMemory((PARAMS,) * N, (ACT,) * N, (OUT,) * N) for t in tps}
    p = Profile("tiny", gpu, N, "fp32", MEASURED, times, 1e-9, mem)
    return ProfileStore({("tiny", gpu): p})


def sim(s=None):
    return Simulator(MODEL, Cluster(), s or store())


def two_stage_plan(zone1="us-central1-a", m=4):
    r0, r1 = Replica("A100-40", 1, "us-central1-a"), Replica("A100-40", 1, zone1)
    return Plan("tiny", 2 * m, (Stage(0, 2, (r0,)), Stage(3, 5, (r1,))), (Pipeline(2, m),))


def test_pipeline_time_by_hand():
    est = sim().simulate(two_stage_plan())
    # both stages on one node (placement), so the boundary is NVLink: 5 us + 2 MB / 300 GB/s
    c = LATENCY_S["intra"] + 2 * OUT / (CATALOG["A100-40"].intra_node_gbps * 1e9)
    F, B = 3e-3, 6e-3
    t_pp = 2 * (F + B) + 2 * c + (4 - 1) * (F + B + 2 * c)
    assert est.pipeline_time_s == pytest.approx(t_pp, rel=1e-12)
    assert est.iteration_time_s == pytest.approx(t_pp + 3 * PARAMS * 1e-9, rel=1e-12)  # + optimizer step
    price = CATALOG["A100-40"].price_per_hour
    assert est.cost_per_iteration_usd == pytest.approx(est.iteration_time_s * 2 * price / 3600)
    assert est.egress_cost_per_iteration_usd == 0


def test_memory_by_hand():
    est = sim().simulate(two_stage_plan())
    overhead = CATALOG["A100-40"].runtime_overhead_bytes
    state, alloc, mbs = 16.0, 1.10, 2  # sailor runtime, fp32
    stage0 = overhead + state * 3 * PARAMS + alloc * mbs * (2 * 3 * ACT + ACT)  # 2 microbatches in flight
    stage1 = overhead + state * 3 * PARAMS + alloc * mbs * (1 * 3 * ACT + ACT)
    assert est.memory_per_stage_bytes == pytest.approx([stage0, stage1])
    assert est.peak_memory_bytes == pytest.approx(stage0) and est.fits_in_memory


def test_recompute_by_hand():
    """Stage 0 (embedding + blocks 1, 2) recomputes its two blocks: their backward also runs
    their forward, and each keeps only its input (the previous layer's output) per sample."""
    from dataclasses import replace

    plan = two_stage_plan()
    plan = replace(plan, stages=(replace(plan.stages[0], recompute=True), plan.stages[1]))
    est, base = sim().simulate(plan), sim().simulate(two_stage_plan())
    c = LATENCY_S["intra"] + 2 * OUT / (CATALOG["A100-40"].intra_node_gbps * 1e9)
    F, B0, B1 = 3e-3, 6e-3 + 2 * 1e-3, 6e-3
    t_pp = (F + B0) + (F + B1) + 2 * c + (4 - 1) * (F + B0 + 2 * c)
    assert est.pipeline_time_s == pytest.approx(t_pp, rel=1e-12)
    overhead = CATALOG["A100-40"].runtime_overhead_bytes
    kept = ACT + 2 * OUT  # the embedding keeps its activations; blocks 1, 2 keep their inputs
    stage0 = overhead + 16.0 * 3 * PARAMS + 1.10 * 2 * (2 * kept + ACT)  # workspace: a block's full ACT
    assert est.memory_per_stage_bytes == pytest.approx([stage0, base.memory_per_stage_bytes[1]])


def test_cross_region_pipeline_pays_wan_and_egress():
    est = sim().simulate(two_stage_plan(zone1="us-west1-b", m=4))
    c = LATENCY_S["continent"] + 2 * OUT / (WAN_GBPS["continent"] * 1e9)
    F, B = 3e-3, 6e-3
    assert est.pipeline_time_s == pytest.approx(2 * (F + B) + 2 * c + 3 * (F + B + 2 * c))
    # 4 microbatches x 2 MB each way, 0.02 $/GB each way between us-central1 and us-west1
    assert est.egress_cost_per_iteration_usd == pytest.approx(4 * 2 * OUT * 2 * 0.02 / 1e9)


def test_data_parallel_ring_allreduce_by_hand():
    r = Replica("A100-40", 4, "us-central1-a")  # a whole 4-GPU node each, so two nodes
    plan = Plan("tiny", 4, (Stage(0, 5, (r, r)),), (Pipeline(2, 1),) * 2)
    est = sim().simulate(plan)
    grads = 4 * N * PARAMS  # fp32 gradients of the whole (TP 1) model
    bw = CATALOG["A100-40"].node_nic_gbps * 1e9 * RING_EFFICIENCY  # no measured fit: the node NIC, full duplex
    ring = 2 * (2 - 1) / 2 * grads / bw + 2 * (2 - 1) * LATENCY_S["zone"]
    assert est.stages[0].sync_s == pytest.approx(ring)
    assert est.iteration_time_s == pytest.approx(N * 3e-3 + ring + N * PARAMS * 1e-9 / 4)  # update: params / tp


def test_a_ring_streams_at_the_measured_one_way_bandwidth():
    """Each NIC sends to one neighbour and receives from the other at once over full-duplex links:
    the ring's edges carry 2(D-1)/D * G at the p2p fit's bandwidth, unless an all-reduce was
    measured over the link (`sailor profile network`), whose efficiency then applies."""
    from dataclasses import replace as dc_replace

    from planner.profiles.network_fits import BandwidthFit, NetworkFits

    r = Replica("A100-40", 4, "us-central1-a")
    plan = Plan("tiny", 6, (Stage(0, 5, (r, r, r)),), (Pipeline(2, 1),) * 3)
    key = ("us-central1-a", "A100-40", 4, "us-central1-a", "A100-40", 4)
    grads = 4 * N * PARAMS
    for efficiency in (None, 0.8):
        s = store()
        s.network = NetworkFits(inter={key: dc_replace(BandwidthFit(0, 0, 2.0, 1e12), allreduce_efficiency=efficiency)})
        ring = 2 * 2 / 3 * grads / (2e9 * (efficiency or 1.0))  # a fit measured end to end: no added latency
        assert sim(s).simulate(plan).stages[0].sync_s == pytest.approx(ring)


def test_slowest_pipeline_dominates_and_more_samples_cost_more():
    s = store()
    fast = sim(s).simulate(two_stage_plan(m=4))
    slow = sim(s).simulate(two_stage_plan(m=8))
    assert slow.iteration_time_s > fast.iteration_time_s
    # per-replica microbatch counts: the pipeline with more microbatches sets the pace
    r = Replica("A100-40", 1, "us-central1-a")
    uneven = Plan("tiny", 24, (Stage(0, 5, (r, r)),), (Pipeline(2, 8), Pipeline(2, 4)))
    even = Plan("tiny", 24, (Stage(0, 5, (r, r)),), (Pipeline(2, 6), Pipeline(2, 6)))
    assert sim(s).simulate(uneven).pipeline_time_s > sim(s).simulate(even).pipeline_time_s


def test_missing_microbatch_size_is_a_clear_error():
    plan = two_stage_plan()
    bad = Plan(plan.model, 16, plan.stages, (Pipeline(4, 4),))
    with pytest.raises(SailorError, match="no microbatch size 4 at TP 1"):
        sim().simulate(bad)


def test_unprofiled_gpu_falls_back_to_an_estimate():
    r = Replica("H100-80", 1, "us-central1-a")
    plan = Plan("tiny", 4, (Stage(0, 5, (r,)),), (Pipeline(2, 2),))
    est = sim().simulate(plan)
    assert est.sources["profile tiny on H100-80"] == "estimated"
    assert est.iteration_time_s > 0 and math.isfinite(est.iteration_time_s)


def test_oom_is_reported():
    r = Replica("A100-40", 1, "us-central1-a")
    plan = Plan("tiny", 2, (Stage(0, 5, (r,)),), (Pipeline(2, 1),))
    huge = store()
    huge.measured[("tiny", "A100-40")].memory[1] = LayerMemory((PARAMS,) * N, (10 * GIB,) * N, (OUT,) * N)
    est = sim(huge).simulate(plan)
    assert not est.fits_in_memory and not est.stages[0].fits


def test_measured_times_are_smoothed_by_the_line_through_each_point_and_its_neighbours():
    """A time measured at b with measurements at b/2 and 2b (same TP) becomes the least-squares line
    through the three, read at b; the smallest and largest sizes, and points without both
    neighbours, stay as measured. Reference: the line worked out by hand (slope = Sxy / Sxx)."""
    from planner.profiles.profile import smooth_over_microbatches

    def fit_at(xs, ys, x):
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
        return my + slope * (x - mx)

    fwd = {1: (1.0, 0.5), 2: (3.0, 0.25), 4: (4.0, 1.0), 8: (9.0, 2.0), 16: (5.0, 3.0)}  # b -> per-layer seconds
    times = {(b, 1): LayerTimes(f, tuple(2 * x for x in f)) for b, f in fwd.items()}
    times[(2, 2)] = LayerTimes((7.0, 7.0), (7.0, 7.0))  # no neighbours at TP 2
    out = smooth_over_microbatches(times)
    assert out[(1, 1)] == times[(1, 1)] and out[(16, 1)] == times[(16, 1)] and out[(2, 2)] == times[(2, 2)]
    assert out[(2, 1)].fwd[0] == pytest.approx(99 / 42)  # the line through (1, 1), (2, 3), (4, 4), at 2
    for b in (2, 4, 8):
        for layer in range(2):
            xs = (b // 2, b, 2 * b)
            ys = [fwd[x][layer] for x in xs]
            assert out[(b, 1)].fwd[layer] == pytest.approx(fit_at(xs, ys, b), rel=1e-12)
            assert out[(b, 1)].bwd[layer] == pytest.approx(fit_at(xs, [2 * y for y in ys], b), rel=1e-12)
    line = {(b, 1): LayerTimes((0.1 + 0.01 * b,), (0.2,)) for b in (1, 2, 4, 8)}  # affine: unchanged
    for key, lt in smooth_over_microbatches(line).items():
        assert lt.fwd == pytest.approx(line[key].fwd, rel=1e-12) and lt.bwd == pytest.approx(line[key].bwd, rel=1e-12)
