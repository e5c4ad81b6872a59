"""The split DP against brute force over every split."""
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.profiles.profile import LayerMemory, LayerTimes
from planner.search.partition import JointSplitTable, SplitTable, StageCosts, pareto


def brute_frontier(costs: StageCosts, comm: float, m: int, P: int):
    L, out = costs.L, []
    for cut in combinations(range(1, L), P - 1):
        edges = (0, *cut, L)
        ok, slot, params = True, 0.0, 0
        for s in range(P):
            first, last = edges[s], edges[s + 1] - 1
            if costs.memory(first, last, min(P - s, m)) > costs.capacity:
                ok = False
                break
            slot = max(slot, costs.compute(first, last) + 2 * comm * ((s > 0) + (s < P - 1)))
            params = max(params, costs.params(first, last))
        if ok:
            out.append((slot, params, cut))
    return pareto(out)


layers = st.integers(3, 9)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), L=layers, m=st.integers(1, 6), comm=st.sampled_from([0.0, 0.01, 0.3]),
       capacity=st.integers(200, 900))
def test_split_table_is_the_exact_pareto_frontier(data, L, m, comm, capacity):
    f = data.draw(st.lists(st.floats(0.01, 1.0), min_size=L, max_size=L))
    params = data.draw(st.lists(st.integers(1, 40), min_size=L, max_size=L))
    acts = data.draw(st.lists(st.floats(1, 60), min_size=L, max_size=L))
    times = LayerTimes(tuple(f), tuple(2 * x for x in f))
    mem = LayerMemory(tuple(params), tuple(acts), (1.0,) * L)
    costs = StageCosts(times, mem, mem, mbs=1, state_bytes=4.0, allocator=1.0, overhead=10.0, capacity=capacity,
                       tied_params=0)
    table = SplitTable(costs, comm, m, L)
    for P in range(1, L + 1):
        got = [(round(s, 9), p) for s, p, _ in table.frontier(P)]
        want = [(round(s, 9), p) for s, p, _ in brute_frontier(costs, comm, m, P)]
        assert got == want, (P, got, want)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), L=layers, mbs=st.sampled_from([1, 2, 8]), tied=st.integers(0, 50))
def test_stage_memory_is_the_simulators_to_the_bit(data, L, mbs, tied):
    """The planner admits a stage by StageCosts.memory and the simulator checks the plan with
    replica_memory: they must agree exactly, or a plan at the edge of memory flips."""
    from planner.simulator.memory import memory_parts, replica_memory
    from planner.simulator.recompute import recomputed_memory

    params = data.draw(st.lists(st.integers(1, 10**9), min_size=L, max_size=L))
    acts = data.draw(st.lists(st.floats(1, 1e9), min_size=L, max_size=L))
    outs = data.draw(st.lists(st.floats(1, 1e8), min_size=L, max_size=L))
    plain = LayerMemory(tuple(params), tuple(acts), tuple(outs))
    step = data.draw(st.sampled_from([0.0, 4.0]))  # the optimizer step's own bytes per parameter
    for mem in (plain, recomputed_memory(plain, tuple(0 < i < L - 1 for i in range(L)))):
        costs = StageCosts(LayerTimes((0.1,) * L, (0.2,) * L), mem, mem, mbs=mbs, state_bytes=24.0, allocator=1.1,
                           overhead=1.5 * 2**30, capacity=0, tied_params=tied, optimizer_step_bytes=step)
        for first in range(L):
            for last in range(first, L):
                for inflight in (1, 3):
                    extra = tied if (last == L - 1 and first > 0) else 0
                    kw = dict(mbs=mbs, inflight=inflight, state_bytes_per_param=24.0, allocator_factor=1.1,
                              overhead_bytes=1.5 * 2**30, optimizer_step_bytes=step, extra_params=extra)
                    total = replica_memory(mem, first, last, **kw)
                    assert costs.memory(first, last, inflight) == total
                    parts = memory_parts(mem, first, last, **kw)
                    assert sum(parts.values()) == pytest.approx(total, rel=1e-12)
                    # the step's tensors come after the activations are freed: the larger of the two counts
                    transient = parts["activations"] + parts["backward workspace"]
                    assert parts["optimizer step"] == pytest.approx(
                        max(0.0, step * (mem.stage_params(first, last) + extra) - transient), rel=1e-12, abs=1e-3)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), L=st.integers(4, 10), capacity=st.integers(150, 900))
def test_joint_table_rows_are_filled_as_deep_pipelines_are_asked_for(data, L, capacity):
    """JointSplitTable fills the rows of its DP up to the deepest pipeline asked for: asked shallow first,
    then deep, it gives what a table filled whole at once gives (two classes, per-stage recomputation)."""
    def costs(scale, recomputing):
        f = data.draw(st.lists(st.floats(0.01, 1.0), min_size=L, max_size=L))
        acts = data.draw(st.lists(st.floats(1, 60), min_size=L, max_size=L))
        times = LayerTimes(tuple(scale * x for x in f), tuple((3 if recomputing else 2) * scale * x for x in f))
        mem = LayerMemory(tuple([5] * L), tuple(a / 4 if recomputing else a for a in acts), (1.0,) * L)
        return StageCosts(times, mem, mem, mbs=1, state_bytes=4.0, allocator=1.0, overhead=10.0,
                          capacity=capacity, tied_params=0)

    recomputing, plains = [costs(1.0, True), costs(1.7, True)], [costs(1.0, False), costs(1.7, False)]
    whole = JointSplitTable(recomputing, [0.01, 0.02], L, plains)
    whole._fill(L)
    lazy = JointSplitTable(recomputing, [0.01, 0.02], L, plains)
    for P in [2, 1, *range(3, L + 1)]:
        assert lazy.frontier(P) == whole.frontier(P), P
        assert lazy.rows == max(1, P - 1)
