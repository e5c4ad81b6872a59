"""Megatron-style grid search: the best uniform 3D configuration on one GPU type.

What a practitioner does with Megatron-LM on the GPUs at hand: try every
configuration the framework accepts and keep the fastest that runs.

Rules (Megatron-LM's constraints):
  * one GPU type, and all of its GPUs: TP x PP x DP = the number given
    (every zone's GPUs of that type, in the order given; no zone choice);
  * one TP degree for every stage (a power of two inside a node), one
    microbatch size for every pipeline, the batch split evenly:
    global batch = DP x microbatch size x microbatches;
  * the transformer blocks split evenly over the PP stages (PP divides the
    number of blocks); the embedding rides with the first stage, the head with
    the last;
  * ranks map to GPUs in Megatron's order (TP fastest, then DP, then PP).

Choice: a grid search has no cost model of its own; every configuration is a
trial run, which here is our simulator (so out-of-memory configurations are
seen and dropped, as a crashed trial would be). With several GPU types, each
type is tried on its own and the fastest wins.
"""
from __future__ import annotations

import math

from planner.baselines.common import (
    BaselineResult, MemoryView, Toolkit, block_bounds, by_type, check_inputs, devices, fits_available, make_plan, timed,
    uniform_layouts,
)
from planner.errors import SailorError
from planner.simulator.simulate import Simulator

NAME = "megatron"
MEMORY = MemoryView.EXACT  # trial runs see the real memory


@timed
def plan(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """The fastest uniform (TP, PP, DP, microbatch size) on one GPU type that fits."""
    check_inputs(NAME, sim, global_batch)
    kit = Toolkit(sim, runtime)
    model = sim.model
    best, tried = None, 0
    even = [P for P in range(1, model.num_blocks + 1) if block_bounds(model.num_blocks, P, strict=True)]
    for gpu, devs in by_type(devices(sim.cluster)).items():
        for mbs, tp, P, D, replicas in uniform_layouts(devs, kit.configs(gpu), even, global_batch):
            candidate = make_plan(sim, global_batch, block_bounds(model.num_blocks, P, strict=True), replicas,
                                  mbs, [global_batch // (D * mbs)] * D, runtime)
            if not fits_available(candidate, sim.cluster):
                continue
            tried += 1
            est = sim.simulate(candidate, kit.rt)  # the trial run
            if est.fits_in_memory and (best is None or est.iteration_time_s < best[0]):
                best = (est.iteration_time_s, candidate)
    if best is None:
        raise SailorError(f"{NAME}: no uniform TP x PP x DP configuration of one GPU type uses all its GPUs and "
                          "fits in memory; give a GPU count that TP x PP x DP can split")
    return BaselineResult(NAME, best[1], best[0], math.nan, tried)
