"""SkyPilot tasks: one task (one YAML file, one `sky launch`) per node group.

A SkyPilot cluster is made of identical nodes in one zone, so the nodes of a
heterogeneous or geo plan cannot be one cluster; and a multi-document YAML is
a chain DAG, which `sky launch` refuses and `sky jobs launch` runs one task
after another (the first group would wait for the others forever). So each
node group is a task of its own, launched side by side on its own cluster,
as SkyPilot users run one job across clusters: all groups meet at one
rendezvous host, the head node of group 0. Group 0's task finds it in
SKYPILOT_NODE_IPS and opens its port; every other task declares
`MASTER_ADDR` without a value, so SkyPilot refuses to launch it until
`--env MASTER_ADDR=...` gives group 0's head address. The plan and cluster
file travel as file_mounts.
"""
from __future__ import annotations

from pathlib import Path

from planner.errors import SailorError
from planner.targets import IMAGE, Inputs, groups, torchrun

# Accelerator names of our GPU types in SkyPilot's catalog.
SKYPILOT_GPU = {"A100-40": "A100", "A100-80": "A100-80GB", "V100-16": "V100", "H100-80": "H100", "H200": "H200",
                "L4": "L4", "T4": "T4"}
REMOTE_DIR = "/tmp/sailor"  # where the plan and cluster file land on every node


def cluster_name(job: str, index: int) -> str:
    return f"{job}-{index}"


def skypilot(layout, inputs: Inputs, train_args: list[str], port: int = 29500, cloud: str = "gcp",
             spot: bool = False, job: str = "sailor") -> list[str]:
    """One task YAML per node group, in launch order."""
    import yaml

    gs = groups(layout)
    mounts = {f"{REMOTE_DIR}/{name}": str(Path(path).resolve()) for name, path in inputs.files().items()}
    tasks = []
    for i, g in enumerate(gs):
        accel = SKYPILOT_GPU.get(g.gpu)
        if accel is None:
            raise SailorError(f"no SkyPilot accelerator name for {g.gpu}; known: {', '.join(sorted(SKYPILOT_GPU))}")
        resources = {"cloud": cloud, "zone": g.zone, "accelerators": f"{accel}:{g.nproc}", "use_spot": spot,
                     "image_id": f"docker:{IMAGE}"}
        if i == 0:
            if len(gs) > 1:
                resources["ports"] = [port]  # the other clusters reach the rendezvous here
            master = "$(echo \"$SKYPILOT_NODE_IPS\" | head -n1)"
            envs = {}
        else:
            master = '"$MASTER_ADDR"'
            envs = {"MASTER_ADDR": None}  # required: sky launch --env MASTER_ADDR=<group 0's head>
        node_rank = f"$(( {g.first_node} + SKYPILOT_NODE_RANK ))" if g.first_node else "$SKYPILOT_NODE_RANK"
        run = torchrun(len(layout.nodes), node_rank, str(g.nproc), master, port,
                       [*inputs.train_args(REMOTE_DIR), *train_args])
        task = {"name": cluster_name(job, i), "resources": resources, "num_nodes": g.nodes,
                "file_mounts": mounts, **({"envs": envs} if envs else {}), "run": run + "\n"}
        tasks.append(yaml.safe_dump(task, sort_keys=False))
    return tasks


def launch_commands(files: list[str], job: str = "sailor") -> list[str]:
    """How to start the tasks written to `files`: group 0 first, the others pointed at its head node."""
    head = cluster_name(job, 0)
    out = [f"sky launch -c {head} -d {files[0]}"]
    for i, f in enumerate(files[1:], 1):
        out.append(f"sky launch -c {cluster_name(job, i)} -d {f} "
                   f"--env MASTER_ADDR=$(ssh {head} hostname -I | cut -d' ' -f1)")
    return out
