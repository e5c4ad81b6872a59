"""Which node each replica runs on.

Replicas of one GPU type in one zone share nodes: walking pipeline by
pipeline (replica k of stage 0, 1, ...), each replica's `tp` GPUs go on the
current node of its (GPU type, zone) if they fit, else on a new node. A TP
group never spans nodes, and consecutive stages of one pipeline share a node
where they can, so the per-microbatch activation traffic stays on NVLink.
The launcher assigns ranks to hosts with this same function.
"""
from __future__ import annotations

from planner.specs.hardware import Cluster
from planner.specs.plan import Plan


def place(plan: Plan, cluster: Cluster) -> list[list[int]]:
    """nodes[s][k]: node id of replica k of stage s (ids are 0, 1, 2, ...)."""
    nodes = [[-1] * plan.dp for _ in plan.stages]
    current: dict[tuple[str, str], tuple[int, int]] = {}  # (gpu, zone) -> (node, free GPUs)
    next_id = 0
    for k in range(plan.dp):
        for s, stage in enumerate(plan.stages):
            r = stage.replicas[k]
            per_node = cluster.gpu(r.gpu).gpus_per_node
            node, free = current.get((r.gpu, r.zone), (-1, 0))
            if free < r.tp:
                node, free = next_id, per_node
                next_id += 1
            nodes[s][k] = node
            current[(r.gpu, r.zone)] = (node, free - r.tp)
    return nodes
