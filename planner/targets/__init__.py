"""Launch files for where a plan runs: Slurm, SkyPilot, Kubernetes, stock Megatron-LM.

Every target starts the processes `sailor launch` prints for torchrun: node i
of the rank layout (planner/launch.py) runs
`torchrun --nnodes N --node-rank i --nproc-per-node n_i ... -m sailor_ext.train`.
What differs is how each scheduler gets nodes of the right GPU type and zone,
gives every node its node rank and the rendezvous host, ships the plan (and
cluster file) to the nodes, and reports a failing rank. Nodes are grouped
into `Group`s: consecutive nodes of one GPU type, zone and process count,
because a Slurm heterogeneous-job component, a SkyPilot cluster and a
PyTorchJob replica set each ask for identical nodes.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from planner.errors import SailorError

IMAGE = "ghcr.io/sailor-train/sailor:latest"


@dataclass(frozen=True)
class Group:
    """Consecutive nodes of the layout with one GPU type, one zone and one process (GPU) count."""

    gpu: str
    zone: str
    first_node: int
    nodes: int
    nproc: int


def groups(layout) -> list[Group]:
    out: list[Group] = []
    for node in layout.nodes:
        g = out[-1] if out else None
        if g and (g.gpu, g.zone, g.nproc) == (node.gpu, node.zone, node.nproc) and g.first_node + g.nodes == node.index:
            out[-1] = Group(g.gpu, g.zone, g.first_node, g.nodes + 1, g.nproc)
        else:
            out.append(Group(node.gpu, node.zone, node.index, 1, node.nproc))
    return out


@dataclass(frozen=True)
class Inputs:
    """The files every rank reads: the plan and, if given, the cluster file (paths as the user gave them)."""

    plan: str
    cluster: str | None = None

    def files(self) -> dict[str, str]:
        """Name on the nodes -> local path."""
        return {"plan.json": self.plan, **({"cluster.yaml": self.cluster} if self.cluster else {})}

    def read(self) -> dict[str, str]:
        """Name on the nodes -> contents (for targets that carry the files themselves)."""
        out = {}
        for name, path in self.files().items():
            try:
                out[name] = Path(path).read_text()
            except OSError as e:
                raise SailorError(f"cannot read {path} to ship it with the job ({e.strerror})") from None
        return out

    def train_args(self, where: str | None = None) -> list[str]:
        """--plan (and --cluster) for sailor_ext.train: the files under directory `where` on the nodes, or as given."""
        files = self.files()
        path = (lambda name: f"{where}/{name}") if where else (lambda name: files[name])
        return ["--plan", path("plan.json"), *(["--cluster", path("cluster.yaml")] if self.cluster else [])]


def torchrun(nnodes: int, node_rank: str, nproc: str, master: str, port: int, train_args: list[str]) -> str:
    """The shell command one node runs; node_rank, nproc and master may be shell expressions."""
    args = " ".join(shlex.quote(a) for a in train_args)
    return (f"torchrun --nnodes={nnodes} --node-rank={node_rank} --nproc-per-node={nproc} "
            f"--master-addr={master} --master-port={port} -m sailor_ext.train {args}")


def per_node(values: list[int], index: str) -> str:
    """A shell expression: values[index], or the value itself when all are equal."""
    if len(set(values)) == 1:
        return str(values[0])
    return f"$(a=({' '.join(map(str, values))}); echo ${{a[{index}]}})"
