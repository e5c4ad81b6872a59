"""Baseline planners: the planning policies of published systems, over our search space.

Each module re-creates one system's idea (our own implementation, written from
the published descriptions), plans for exactly the GPUs it is handed (none of
them co-optimizes which GPUs to use), chooses with its own cost model, and
returns a Plan that our simulator accepts. The simulator is the common judge;
bench/compare_planners.py runs them against our planner.

    megatron   uniform TP x PP x DP grid search on one GPU type (trial runs)
    varuna     PP + DP without TP, recomputation-based memory model
    piper      two-level dynamic program over layers and devices, one GPU type
    amp        uniform 3D configurations over mixed GPUs, heterogeneity-aware layer split
    metis      GPU types to stages, balanced layer split and batch shares, no zone choice
    flashflex  identical mixed-GPU pipelines, capacity-proportional layer split
    dtfm       PP + DP placed across zones by a communication cost model
"""
from __future__ import annotations

from planner.baselines import amp, dtfm, flashflex, megatron, metis, piper, varuna
from planner.baselines.common import BaselineResult
from planner.errors import SailorError

BASELINES = {m.NAME: m.plan for m in (megatron, varuna, piper, amp, metis, flashflex, dtfm)}


def run_baseline(name: str, sim, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """Plan with the baseline called `name` for the GPUs of `sim.cluster`."""
    try:
        fn = BASELINES[name]
    except KeyError:
        raise SailorError(f"unknown baseline {name!r}: use one of {', '.join(BASELINES)}") from None
    return fn(sim, global_batch, runtime)


__all__ = ["BASELINES", "BaselineResult", "run_baseline"]
