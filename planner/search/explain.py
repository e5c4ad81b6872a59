"""Why no plan was found: one line that names the binding limit and what to do."""
from __future__ import annotations

import math

from planner.search.goal import Goal
from planner.search.planner import RECOMPUTE_MODES
from planner.search.space import capacity


def explain_infeasible(planner, goal: Goal) -> str:
    sim, model = planner.sim, planner.model
    shapes = planner.shapes()
    if not shapes:
        return (f"no usable microbatch size: none of the profiled sizes divides the global batch {planner.gbs}, "
                "or no profile covers the GPUs given; change --global-batch or profile more sizes")
    # Memory: even the largest TP degree cannot hold one layer of the model (with the distributed
    # optimizer, split over as many replicas as could ever be: the least memory any plan needs)
    least = {id(sh): sh.costs.sharded(math.inf) for sh in shapes}
    smallest = min(min(least[id(sh)].memory(i, i, 1) for i in range(planner.L)) for sh in shapes)
    fits_one = [sh for sh in shapes if any(least[id(sh)].last_fit(1)[i] >= i for i in range(planner.L))]
    largest_gpu = max(sim.cluster.gpu(sh.gpu).memory_bytes for sh in shapes)
    if not fits_one:
        return (f"{model.name} does not fit: its smallest layer needs {smallest / 1e9:.1f} GB per GPU at the "
                f"highest TP degree and microbatch size 1, but the largest GPU given has {largest_gpu / 1e9:.1f} GB; "
                "add GPUs with more memory")
    # whether any plan fits does not depend on the objective, so the fastest plan's search answers it
    fastest = planner.again(Goal("throughput")).run(top=1)
    if not fastest.plans:
        if planner.recompute == "never" and planner.again(Goal(goal.objective), recompute="auto").run(top=1).plans:
            return (f"{model.name} does not fit on the GPUs given without recomputing activations; allow it with "
                    "--recompute auto, or add GPUs")
        # (over the passes the search ran: recomputing stages need less memory)
        need, how, gpu = min(_least_memory(planner, sh, rc) for rc in RECOMPUTE_MODES[planner.recompute]
                             for sh in planner.shapes(rc))
        have = sim.cluster.gpu(gpu).memory_bytes
        return (f"{model.name} does not fit on the GPUs given: the best placement ({how}) still needs "
                f"{need / 1e9:.1f} GB on a {gpu} with {have / 1e9:.1f} GB; add GPUs (deeper pipelines, more TP) or "
                "larger GPUs")
    f = fastest.plans[0][1]
    if goal.min_throughput and f.throughput_iters_per_s < goal.min_throughput:
        return (f"--min-throughput {goal.min_throughput:g} it/s is out of reach: the fastest plan on these GPUs "
                f"does {f.throughput_iters_per_s:.4g} it/s; add GPUs or lower the floor")
    # (a cost search leaves out two types side by side: with the distributed optimizer, the only plans that
    # fit may be such)
    cheapest = planner.again(Goal("cost")).run(top=1).plans if goal.max_cost_per_iteration else []
    if cheapest and cheapest[0][1].cost_per_iteration_usd > goal.max_cost_per_iteration:
        return (f"--max-cost-per-iter ${goal.max_cost_per_iteration:g} is below the cheapest feasible plan "
                f"(${cheapest[0][1].cost_per_iteration_usd:.4g}/iteration); raise the budget")
    if goal.max_cost_per_hour:
        return (f"no plan meets --max-cost-per-hour ${goal.max_cost_per_hour:g} together with the other limits "
                f"(the fastest plan costs ${f.cost_per_hour_usd:.4g}/hour); raise the budget or relax the limits")
    return ("no plan meets all the limits together (each can be met alone); relax --min-throughput, "
            "--max-cost-per-iter, --max-cost-per-hour or --max-gpus")


def _least_memory(planner, shape, recompute: bool) -> tuple[float, str, str]:
    """The smallest peak memory per GPU of a single-pool placement the search could run on this shape's
    GPUs: only pipelines a zone holds under the placement rule (space.capacity: deeper than a node, a
    node per stage), as many as fit (fewest in flight, most optimizer shards). Placements that cannot
    run may need less memory than the GPUs have, and quoting them contradicts finding no plan."""
    L, M = planner.L, planner.gbs // shape.mbs
    best = (float("inf"), "", shape.gpu)
    for P in range(1, min(L, planner.max_stages) + 1):
        d = min(sum(capacity(n, shape.per_node, P, shape.tp) for _, n in shape.zones), M)
        if d < 1:
            continue
        costs, m = shape.costs.sharded(planner._shards(d)), -(-M // d)
        # worst[j][r]: least possible largest stage memory for layers j..L-1 in r+1 stages
        worst = [[float("inf")] * P for _ in range(L + 1)]
        for r in range(P):
            for j in range(L - 1, -1, -1):
                if r == 0:
                    worst[j][0] = costs.memory(j, L - 1, 1)
                else:
                    worst[j][r] = min((max(costs.memory(j, i - 1, min(r + 1, m)), worst[i][r - 1])
                                       for i in range(j + 1, L - r + 1)), default=float("inf"))
        if worst[0][P - 1] < best[0]:
            best = (worst[0][P - 1], f"{P} stage{'s' if P > 1 else ''}, TP {shape.tp}, microbatch size {shape.mbs}"
                    f"{', recomputing activations' if recompute else ''}", shape.gpu)
    return best
