"""A Slurm batch script: one heterogeneous-job component per node group, one job step for all of them.

Each component asks for its nodes by GPU type and zone as node features
(`--constraint=TYPE&ZONE`; a geo plan's zones are thus kept) and for its GPUs
as generic resources. A single `srun` spans every component (`--het-group`),
one task per node, so each node's torchrun finds its node rank in
SLURM_PROCID and its process count in the plan's per-node list. One step
makes the job's state honest: `--kill-on-bad-exit` ends every node as soon
as one rank fails, and the script exits with the step's status, so sacct
shows FAILED (a backgrounded `srun ... &` and a bare `wait` would report
COMPLETED).
"""
from __future__ import annotations

import shlex

from planner.targets import Inputs, groups, per_node, torchrun


def feature(name: str) -> str:
    """A GPU type or zone as a Slurm node feature (letters, digits, '-', '_' and '.' are kept)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def slurm(layout, inputs: Inputs, train_args: list[str], port: int = 29500, job: str = "sailor") -> str:
    gs = groups(layout)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", "#SBATCH --output=%x-%j.out"]
    for i, g in enumerate(gs):
        if i:
            lines.append("#SBATCH hetjob")
        lines += [f"#SBATCH --nodes={g.nodes}", "#SBATCH --ntasks-per-node=1",
                  f"#SBATCH --constraint={feature(g.gpu)}&{feature(g.zone)}"]
        if g.gpu != "CPU":  # CPU plans (tests, local runs) need no GPUs
            lines.append(f"#SBATCH --gres=gpu:{g.nproc}")
    nprocs = [n.nproc for n in layout.nodes]
    cmd = torchrun(len(layout.nodes), "$SLURM_PROCID", per_node(nprocs, "$SLURM_PROCID"), '"$MASTER_ADDR"', port,
                   [*inputs.train_args(), *train_args])
    het = f" --het-group=0-{len(gs) - 1}" if len(gs) > 1 else ""
    lines += [
        "",
        "# node 0 (the first node of the first component) hosts the rendezvous, at the address Slurm reaches it by",
        'HEAD=$(scontrol show hostnames "${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}" | head -n1)',
        'MASTER_ADDR=$(scontrol show node "$HEAD" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        'export MASTER_ADDR=${MASTER_ADDR:-$HEAD}',
        f"# one task per node over all {len(layout.nodes)} nodes; node rank = task rank; one failing rank fails "
        "the job",
        f"srun{het} --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {shlex.quote(cmd)}",
        "",
    ]
    return "\n".join(lines)
