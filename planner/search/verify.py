"""The promises a returned plan keeps, judged by the simulator.

The search prunes and scores with its own arithmetic (bounds, frontiers,
cached rings). Before a plan leaves the planner it is simulated again and
held to everything the user asked for: its time and cost must be the ones the
search ranked it by, it must fit in memory, meet every limit of the goal
(dollars per iteration and per hour, iterations per second, GPU count) and use
no more GPUs of a type in a zone than are available there, whole nodes
counted, nor more than a zone's quota. A broken promise is a bug in the
planner, never the user's: it raises AssertionError, which the CLI reports as
an internal error.
"""
from __future__ import annotations

import math
from collections import defaultdict

from planner.search.goal import Goal, Outcome
from planner.simulator.placement import place
from planner.specs.hardware import Cluster
from planner.specs.plan import Plan

REL = 1e-9  # search and simulator add the same terms in another order


def _over(value: float, limit: float) -> bool:
    return value > limit * (1 + REL)


def unavailable(plan: Plan, cluster: Cluster) -> list[str]:
    """What the plan uses beyond the cluster's pools and quotas, under the simulator's node placement."""
    nodes = place(plan, cluster)
    by_node: dict = defaultdict(lambda: defaultdict(int))  # (gpu, zone) -> node -> GPUs
    for s, stage in enumerate(plan.stages):
        for k, r in enumerate(stage.replicas):
            by_node[(r.gpu, r.zone)][nodes[s][k]] += r.tp
    problems, per_zone = [], defaultdict(int)
    for (gpu, zone), used in by_node.items():
        have = sum(p.count for p in cluster.available if (p.gpu, p.zone) == (gpu, zone))
        full, partial = divmod(have, cluster.gpu(gpu).gpus_per_node)
        sizes = sorted(used.values(), reverse=True)
        if len(sizes) > full + (partial > 0) or (len(sizes) > full and sizes[full] > partial):
            problems.append(f"{sum(sizes)} {gpu} in {zone} on {len(sizes)} nodes, but {have} are available")
        per_zone[zone] += sum(sizes)
    problems += [f"{n} GPUs in {z}, above its quota of {cluster.quotas[z]}" for z, n in per_zone.items()
                 if z in cluster.quotas and n > cluster.quotas[z]]
    return problems


def broken_promises(plan: Plan, est, goal: Goal, cluster: Cluster, searched: Outcome | None = None) -> list[str]:
    """Every way `plan` (simulated as `est`) falls short of `goal` and `cluster`; empty if none."""
    out = []
    if searched is not None:
        for what, mine, sim in (("iteration time", searched.iteration_time_s, est.iteration_time_s),
                                ("cost per iteration", searched.cost_per_iteration_usd, est.cost_per_iteration_usd)):
            if not math.isclose(mine, sim, rel_tol=REL):
                out.append(f"the search's {what} {mine!r} is not the simulator's {sim!r}")
    if not est.fits_in_memory:
        out.append("it does not fit in memory")
    if sum(p.samples for p in plan.pipelines) != plan.global_batch_size:
        out.append("its pipelines do not process the global batch")
    if goal.max_cost_per_iteration is not None and _over(est.cost_per_iteration_usd, goal.max_cost_per_iteration):
        out.append(f"${est.cost_per_iteration_usd:.6g}/iteration is above --max-cost-per-iter "
                   f"{goal.max_cost_per_iteration:g}")
    if goal.max_cost_per_hour is not None and _over(est.cost_per_hour_usd, goal.max_cost_per_hour):
        out.append(f"${est.cost_per_hour_usd:.6g}/hour is above --max-cost-per-hour {goal.max_cost_per_hour:g}")
    if goal.min_throughput is not None and _over(goal.min_throughput, est.throughput_iters_per_s):
        out.append(f"{est.throughput_iters_per_s:.6g} it/s is below --min-throughput {goal.min_throughput:g}")
    if goal.max_gpus is not None and plan.num_gpus > goal.max_gpus:
        out.append(f"{plan.num_gpus} GPUs is above --max-gpus {goal.max_gpus}")
    return out + unavailable(plan, cluster)


def check_promises(plan: Plan, est, goal: Goal, cluster: Cluster, searched: Outcome | None = None) -> None:
    problems = broken_promises(plan, est, goal, cluster, searched)
    if problems:
        raise AssertionError(f"the planner would return a plan that breaks its promises ({'; '.join(problems)}): "
                             f"{plan}")
