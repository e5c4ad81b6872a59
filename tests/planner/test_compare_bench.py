"""The bookkeeping of bench/compare_planners.py: how failures are counted, what a user's sweep tries."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "compare_planners.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("compare_planners", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_out_of_memory_and_missing_plans_are_failures_not_ratios(bench):
    planners = {
        "sailor": {"throughput_iters_per_s": 0.5, "fits_in_memory": True},
        "amp": {"throughput_iters_per_s": 0.6, "fits_in_memory": False},
        "metis": {"throughput_iters_per_s": 0.25, "fits_in_memory": True},
        "megatron": {"error": "megatron: no configuration"},
    }
    assert bench.speedups(planners) == {"amp": "OOM", "metis": 2.0, "megatron": "no plan"}
    rows = [{"speedup_of_sailor": bench.speedups(planners)},
            {"speedup_of_sailor": {"amp": 1.5, "metis": 1.1, "megatron": 1.0}}]
    ranges = bench.ratio_range(rows + [{"speedup_of_sailor": {}}], ["amp", "metis", "megatron"])
    assert ranges["amp"] == {"min": 1.5, "max": 1.5, "oom": 1, "no_plan": 0, "cases": 2}
    assert ranges["megatron"]["no_plan"] == 1 and ranges["metis"]["max"] == 2.0


def test_a_users_sweep_tries_every_pool_type_and_scale(bench):
    pools = [("A100-40", "a", 128), ("V100-16", "a", 128), ("A100-40", "b", 64)]
    allocs = bench.sweep(pools, (1, 2))
    assert pools in allocs  # everything, as given
    assert [("A100-40", "a", 64), ("A100-40", "b", 32)] in allocs  # one type, halved
    assert [("V100-16", "a", 128)] in allocs and [("A100-40", "b", 32)] in allocs  # single pools
    assert len(allocs) == len({tuple(a) for a in allocs})  # no allocation twice


def test_cells_mark_out_of_memory_plans(bench):
    assert bench._cell({"throughput_iters_per_s": 0.1234, "cost_per_iteration_usd": 0.5,
                        "fits_in_memory": False}) == "OOM [0.123 ($0.50)]"
    assert bench._cell({"error": "x"}) == "no plan"


def test_worst_ratio_names_the_rival_that_beats_us(bench):
    def row(case, ours, **rivals):
        planners = {"sailor": {"throughput_iters_per_s": ours, "fits_in_memory": True}}
        planners.update({k: {"throughput_iters_per_s": v, "fits_in_memory": True} for k, v in rivals.items()})
        return {"case": case, "planners": planners}

    results = {"geo": [row("a", 1.0, amp=0.5), row("b", 1.0, metis=1.02, amp=0.9)],
               "homogeneous": [row("c", 2.0, varuna=1.0)]}
    results["homogeneous"][0]["planners"]["dtfm"] = {"throughput_iters_per_s": 9.0, "fits_in_memory": False}
    worst = bench.worst_ratio(results)
    assert worst["case"] == "b" and worst["planner"] == "metis" and worst["beaten"]
    assert worst["ratio"] == pytest.approx(1 / 1.02)
    assert not bench.worst_ratio({"geo": [row("a", 1.0, amp=0.5)]})["beaten"]
