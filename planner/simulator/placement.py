"""Which node each replica runs on.

Per pool (one GPU type in one zone), with n GPUs per node:
  * if every pipeline needs at most n GPUs in the pool, pipelines are packed
    whole, first fit in pipeline order: a pipeline's stages share one node,
    so its activations stay on NVLink;
  * otherwise replicas are packed stage by stage (replicas of one stage share
    nodes, first fit in pipeline order), so a stage's gradient ring is partly
    on NVLink; stages then talk over the network.
A TP group never spans nodes. Identical pipelines get identical layouts,
which the planner relies on. The launcher assigns ranks to hosts with this
same function.
"""
from __future__ import annotations

from collections import defaultdict

from planner.specs.hardware import Cluster
from planner.specs.plan import Plan


def place(plan: Plan, cluster: Cluster) -> list[list[int]]:
    """nodes[s][k]: node id of replica k of stage s (ids are 0, 1, 2, ...)."""
    nodes = [[-1] * plan.dp for _ in plan.stages]
    by_pool: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)  # pool -> [(s, k)]
    for k in range(plan.dp):
        for s, st in enumerate(plan.stages):
            r = st.replicas[k]
            by_pool[(r.gpu, r.zone)].append((s, k))
    next_id = 0
    for (gpu, _), members in by_pool.items():
        per_node = cluster.gpu(gpu).gpus_per_node
        need: dict[int, int] = defaultdict(int)
        stages_of: dict[int, list[int]] = defaultdict(list)
        for s, k in members:
            need[k] += plan.stages[s].replicas[k].tp
            stages_of[k].append(s)
        if max(need.values()) <= per_node:  # whole pipelines per node
            free: list[int] = []  # free GPUs of this pool's nodes, by node index
            first_id, open_from = next_id, 0  # nodes before open_from are full
            for k in sorted(need):
                slot = next((i for i in range(open_from, len(free)) if free[i] >= need[k]), None)
                if slot is None:
                    free.append(per_node)
                    slot = len(free) - 1
                free[slot] -= need[k]
                while open_from < len(free) and free[open_from] == 0:
                    open_from += 1
                for s in stages_of[k]:
                    nodes[s][k] = first_id + slot
            next_id = first_id + len(free)
        else:  # stage by stage
            replicas_of: dict[int, list[int]] = defaultdict(list)  # stage -> its replicas here, in order
            for s, k in members:
                replicas_of[s].append(k)
            for s in sorted(replicas_of):
                free = 0
                for k in replicas_of[s]:
                    tp = plan.stages[s].replicas[k].tp
                    if free < tp:
                        next_id += 1
                        free = per_node
                    nodes[s][k] = next_id - 1
                    free -= tp
    return nodes
