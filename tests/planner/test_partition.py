"""The split DP against brute force over every split."""
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.profiles.profile import LayerMemory, LayerTimes
from planner.search.partition import SplitTable, StageCosts, pareto


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
