"""Varuna-style planning: pipeline and data parallelism only, no tensor parallelism.

Varuna (EuroSys'22) trains on commodity VMs with PP x DP and picks the
pipeline depth and microbatch size from profiles with its own simulator.

Rules:
  * one GPU type; TP 1 on every GPU;
  * for a pipeline depth P, D = N // P pipelines (all the GPUs that a whole
    number of pipelines can take; fewer if the nodes cannot hold them);
  * the transformer blocks cut into P near-equal stages ("cut-points" evenly
    spaced), embedding on the first stage, head on the last;
  * one microbatch size; the gbs / mbs microbatches spread evenly;
  * ranks in Megatron's order over the GPUs given (no zone choice).

Cost model (Varuna's, in spirit): the 1F1B time of its stages with every
backward pass preceded by a recomputed forward (Varuna always recomputes
activations), p2p on the fill/drain path, plus a ring all-reduce of the
largest stage's gradients. Memory is checked as Varuna sees it: with
recomputation of whole stages from their inputs (MemoryView.RECOMPUTE). Its
plans recompute on every stage; the runtime every planner is judged on
recomputes block by block (keeping every block's input), so a plan that fits
only by Varuna's count can still run out of memory under our simulator.

With several GPU types, each is planned on its own and the best estimate wins.
"""
from __future__ import annotations

import math

from planner.baselines.common import (
    BaselineResult, MemoryView, Toolkit, block_bounds, by_type, check_inputs, devices, even_shares, make_plan,
    most_pipelines, pipeline_estimate, rank_order, stage_ranges, timed,
)
from planner.errors import SailorError
from planner.simulator.simulate import Simulator
from planner.specs.plan import Replica

NAME = "varuna"
MEMORY = MemoryView.RECOMPUTE


@timed
def plan(sim: Simulator, global_batch: int, runtime: str = "sailor") -> BaselineResult:
    """The (P, microbatch size) with the lowest Varuna estimate, TP 1, on one GPU type."""
    check_inputs(NAME, sim, global_batch)
    devs_all = devices(sim.cluster)
    kit = Toolkit(sim, runtime, flat_zone=devs_all[0][1])
    model, L = sim.model, sim.model.num_layers
    best, looked = None, 0
    for gpu, devs in by_type(devs_all).items():
        sizes = [b for b, t in kit.configs(gpu) if t == 1 and global_batch % b == 0]
        if not sizes:
            continue
        for P in range(1, min(model.num_blocks, len(devs)) + 1):
            bounds = block_bounds(model.num_blocks, P)
            ranges = stage_ranges(L, bounds)
            d_max = most_pipelines(sim, devs, [1] * P, len(devs) // P)  # N // P, or what the nodes hold
            for mbs in sizes:
                D = min(d_max, global_batch // mbs)
                shares = even_shares(global_batch, mbs, D) if D else None
                if shares is None:
                    continue
                looked += 1
                c = kit.costs(gpu, mbs, 1)
                m = max(shares)
                if not all(c.fits(MEMORY, f, last, min(P - s, m)) for s, (f, last) in enumerate(ranges)):
                    continue
                # recomputation: every backward pass first re-runs the stage's forward
                times = [c.fb(f, last) + c.fwd(f, last) for f, last in ranges]
                rep = Replica(gpu, 1, devs[0][1])
                sync = max(kit.allreduce(c.grad_params(f, last), [rep] * D) for f, last in ranges)
                estimate = pipeline_estimate(times, [kit.p2p(mbs, rep, rep)] * (P - 1), m) + sync
                if best is None or estimate < best[0]:
                    best = (estimate, make_plan(sim, global_batch, bounds, rank_order(devs, D, [1] * P), mbs,
                                                shares, runtime, recompute=True))
    if best is None:
        raise SailorError(f"{NAME}: no pipeline depth fits the model in memory without tensor parallelism on the "
                          "GPUs given")
    return BaselineResult(NAME, best[1], best[0], math.nan, looked)
