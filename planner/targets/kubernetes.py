"""Kubernetes: Kubeflow PyTorchJobs, with the plan (and cluster file) in a ConfigMap mounted into every pod.

A plan on one node group (identical nodes) is one elastic job: Worker
replicas only (the training operator's webhook requires a Worker replica
for an elastic job), `spec.nprocPerNode`, and a c10d rendezvous at worker 0;
any pod may be any node. A plan on several groups pins node ranks instead,
since node i must run on the GPU type and zone the plan gave it: one job per
group, each with its own node selector and GPU count, the first with the one
Master (node 0, the rendezvous host); a pod's node rank is its group's first
node plus its replica index (downward API). Replicas restart only on
retryable exit codes (`ExitCode`): a rank that fails with a user mistake
(exit 2) fails the job instead of restarting forever.
"""
from __future__ import annotations

import shlex

from planner.targets import IMAGE, Inputs, groups

# GKE's node label values for our GPU types.
GKE_GPU = {"A100-40": "nvidia-tesla-a100", "A100-80": "nvidia-a100-80gb", "V100-16": "nvidia-tesla-v100",
           "H100-80": "nvidia-h100-80gb", "H200": "nvidia-h200-141gb", "L4": "nvidia-l4", "T4": "nvidia-tesla-t4"}
MOUNT = "/etc/sailor"
REPLICA_INDEX = "metadata.labels['training.kubeflow.org/replica-index']"


def kubernetes(layout, inputs: Inputs, train_args: list[str], port: int = 29500, image: str = IMAGE,
               job: str = "sailor") -> str:
    """A multi-document manifest for `kubectl apply -f`: the ConfigMap, then the PyTorchJobs."""
    import yaml

    gs = groups(layout)
    elastic = len(gs) == 1
    files = f"{job}-files"
    train = " ".join(shlex.quote(a) for a in ["-m", "sailor_ext.train", *inputs.train_args(MOUNT), *train_args])
    docs: list[dict] = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": files, "labels": {"app": job}},
                         "data": inputs.read()}]
    master_host = f"{job}-0-worker-0" if elastic else f"{job}-0-master-0"
    for i, g in enumerate(gs):
        def template(first_node: int) -> dict:
            if elastic:
                run = (f"torchrun --nnodes={g.nodes} --nproc-per-node={g.nproc} --rdzv-backend=c10d "
                       f"--rdzv-endpoint={master_host}:{port} --rdzv-id={job} {train}")
            else:
                run = (f"torchrun --nnodes={len(layout.nodes)} --node-rank=$(( {first_node} + REPLICA_INDEX )) "
                       f"--nproc-per-node={g.nproc} --master-addr={master_host} --master-port={port} {train}")
            selector = {"topology.kubernetes.io/zone": g.zone}
            if g.gpu in GKE_GPU:
                selector["cloud.google.com/gke-accelerator"] = GKE_GPU[g.gpu]
            container = {
                "name": "pytorch", "image": image, "command": ["bash", "-c", run],
                "env": [{"name": "REPLICA_INDEX", "valueFrom": {"fieldRef": {"fieldPath": REPLICA_INDEX}}}],
                "volumeMounts": [{"name": "sailor-files", "mountPath": MOUNT, "readOnly": True}],
            }
            if g.gpu != "CPU":
                container["resources"] = {"limits": {"nvidia.com/gpu": str(g.nproc)}}  # quantities are strings
            return {"metadata": {"labels": {"app": job, "sailor/group": str(i)}},
                    "spec": {"containers": [container], "nodeSelector": selector,
                             "volumes": [{"name": "sailor-files", "configMap": {"name": files}}]}}

        def replicas(n: int, first_node: int) -> dict:
            return {"replicas": n, "restartPolicy": "ExitCode", "template": template(first_node)}

        specs = {}
        workers, first_worker = g.nodes, g.first_node
        if not elastic and i == 0:
            specs["Master"] = replicas(1, 0)
            workers, first_worker = workers - 1, 1
        if workers:
            specs["Worker"] = replicas(workers, first_worker)
        spec: dict = {"nprocPerNode": str(g.nproc), "pytorchReplicaSpecs": specs}
        if elastic:
            spec["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": g.nodes, "maxReplicas": g.nodes,
                                     "maxRestarts": 10}
        docs.append({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                     "metadata": {"name": f"{job}-{i}", "labels": {"app": job}}, "spec": spec})
    return yaml.safe_dump_all(docs, sort_keys=False)
