"""From the nodes present to a plan and the worker that runs each of its ranks.

The planner sees the nodes as pools (GPU type, zone, count); the node size of
each GPU type is taken from the nodes themselves, since the rank layout
(planner/launch.py: a TP group never spans nodes) depends on it. The layout's
nodes are then matched to real nodes of the same type and zone, oldest
first, so a plan keeps using the nodes it used before where it can.

A new plan replaces a running one only when it pays off: the time it saves
over the remaining steps must exceed what a reconfiguration costs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from planner.elastic.protocol import NodeInfo
from planner.errors import SailorError
from planner.launch import check_runnable, rank_layout
from planner.specs.hardware import Cluster, Pool
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan


@dataclass(frozen=True)
class Proposal:
    plan: Plan
    iteration_time_s: float  # the simulator's estimate
    ranks: tuple[tuple[str, int], ...]  # rank -> (node, worker index)
    gpus_per_node: dict[str, int]
    planning_s: float

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for n, _ in self.ranks))

    def describe(self) -> str:
        p = self.plan
        tps = sorted({r.tp for s in p.stages for r in s.replicas})
        mbs = sorted({q.microbatch_size for q in p.pipelines})
        return (f"{p.pp} stage(s) x {p.dp} replica(s), TP {'/'.join(map(str, tps))}, microbatch "
                f"{'/'.join(map(str, mbs))}, {len(self.ranks)} ranks on {len(self.nodes)} node(s)")


def pays_off(current_s: float, proposed_s: float, remaining_steps: int, reconfigure_s: float) -> bool:
    """Switch plans when the time saved over the remaining steps exceeds the switch."""
    return (current_s - proposed_s) * max(0, remaining_steps) > reconfigure_s


class Replanner:
    """Plans with the planner for a set of nodes (no torch)."""

    def __init__(self, model: ModelSpec, cluster: Cluster, profiles, global_batch: int, goal,
                 precision: str | None = None, max_tp: int = 8, distributed_optimizer: bool = False):
        self.model, self.cluster, self.profiles = model, cluster, profiles
        self.global_batch, self.goal, self.precision, self.max_tp = global_batch, goal, precision, max_tp
        self.distributed_optimizer = distributed_optimizer  # the job's workers split their optimizer state

    def cluster_for(self, nodes: list[NodeInfo]) -> Cluster:
        """The cluster with each GPU type's node size taken from the nodes (the smallest, if they differ)."""
        sizes: dict[str, int] = {}
        for n in nodes:
            sizes[n.gpu] = min(sizes.get(n.gpu, n.gpus), n.gpus)
        gpus = dict(self.cluster.gpus)
        for gpu, size in sizes.items():
            gpus[gpu] = replace(self.cluster.gpu(gpu), gpus_per_node=size)
        pools: dict[tuple[str, str], int] = {}
        for n in nodes:
            # a node larger than its type's node size counts as whole nodes of that size
            pools[(n.gpu, n.zone)] = pools.get((n.gpu, n.zone), 0) + n.gpus // sizes[n.gpu] * sizes[n.gpu]
        return replace(self.cluster, gpus=gpus, available=tuple(Pool(g, z, c) for (g, z), c in pools.items()))

    def _planner(self, nodes: list[NodeInfo]):
        from planner.search.planner import Planner
        from planner.simulator.simulate import Simulator
        from planner.specs.precision import resolve_precision

        cluster = self.cluster_for(nodes)
        # the job's precision, else the default rule for the GPU types these nodes have (specs/precision.py)
        precision = resolve_precision(self.precision, [cluster.gpu(p.gpu) for p in cluster.available])
        sim = Simulator(self.model, cluster, self.profiles, precision)
        return cluster, Planner(sim, self.global_batch, self.goal, max_tp=self.max_tp,
                                distributed_optimizer=self.distributed_optimizer)

    def explain(self, nodes: list[NodeInfo]) -> str:
        """Why no plan runs on `nodes` (for a job that could never start)."""
        from planner.search.explain import explain_infeasible

        try:
            _, planner = self._planner(nodes)
            return explain_infeasible(planner, self.goal)
        except SailorError as e:
            return str(e)

    def propose(self, nodes: list[NodeInfo]) -> Proposal | None:
        """The planner's best plan on `nodes` (oldest first), or None if nothing fits."""
        if not nodes:
            return None
        start = time.perf_counter()
        try:
            cluster, planner = self._planner(nodes)
            result = planner.run(top=1)
        except SailorError:
            return None
        if not result.plans:
            return None
        plan, estimate = result.plans[0]
        check_runnable(plan, self.model, cluster)
        try:
            ranks = assign(plan, cluster, nodes)
        except SailorError:  # no way to seat the plan on these nodes: wait for others, as when nothing fits
            return None
        sizes = {g: cluster.gpu(g).gpus_per_node for g in {n.gpu for n in nodes}}
        return Proposal(plan, estimate.iteration_time_s, ranks, sizes, time.perf_counter() - start)


def assign(plan: Plan, cluster: Cluster, nodes: list[NodeInfo]) -> tuple[tuple[str, int], ...]:
    """(node id, worker index) of every rank: layout nodes onto real nodes of the same type and zone, first
    fit. The plan's nodes have the smallest real node's size (cluster_for), so a larger real node may seat
    several of them, its workers numbered on from the ones already taken (an 8-GPU node and a 1-GPU node
    give 9 one-GPU layout nodes: each took a real node of its own before, and the 9th found none)."""
    layout = rank_layout(plan, cluster)
    free: dict[tuple[str, str], list[NodeInfo]] = {}
    for n in nodes:
        free.setdefault((n.gpu, n.zone), []).append(n)
    used: dict[str, int] = {}  # workers of each real node already given a rank
    chosen: dict[int, tuple[str, int]] = {}  # layout node -> (real node, its first worker)
    for ln in layout.nodes:
        fit = next((n for n in free.get((ln.gpu, ln.zone), []) if n.gpus - used.get(n.id, 0) >= ln.nproc), None)
        if fit is None:
            raise SailorError(f"the plan needs a node of {ln.nproc} x {ln.gpu} in {ln.zone} that is not present")
        chosen[ln.index] = (fit.id, used.get(fit.id, 0))
        used[fit.id] = used.get(fit.id, 0) + ln.nproc
    return tuple((chosen[s.node][0], chosen[s.node][1] + s.local_rank) for s in layout.slots)
