"""Launch files for where a plan runs: Slurm, SkyPilot, Kubernetes, stock Megatron-LM.

Every target starts the same processes `sailor launch` prints for torchrun:
node i of the rank layout (planner/launch.py) runs
`torchrun --nnodes N --node-rank i --nproc-per-node n_i ... -m sailor_ext.train`.
Nodes are grouped by (GPU type, zone); each group becomes one Slurm
heterogeneous-job component, one SkyPilot task, or one Kubeflow PyTorchJob.
A group's nodes get node ranks OFFSET + their index in the group.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from planner.errors import SailorError

IMAGE = "ghcr.io/sailor-train/sailor:latest"
# Accelerator names of our GPU types: SkyPilot's, and GKE's node label values.
SKYPILOT_GPU = {"A100-40": "A100", "A100-80": "A100-80GB", "V100-16": "V100", "H100-80": "H100", "H200": "H200",
                "L4": "L4", "T4": "T4"}
GKE_GPU = {"A100-40": "nvidia-tesla-a100", "A100-80": "nvidia-a100-80gb", "V100-16": "nvidia-tesla-v100",
           "H100-80": "nvidia-h100-80gb", "H200": "nvidia-h200-141gb", "L4": "nvidia-l4", "T4": "nvidia-tesla-t4"}


@dataclass(frozen=True)
class Group:
    """Consecutive nodes of the layout with one GPU type in one zone."""

    gpu: str
    zone: str
    first_node: int
    nodes: int
    nproc: int  # processes (GPUs) per node; the largest of the group


def groups(layout) -> list[Group]:
    out: list[Group] = []
    for node in layout.nodes:
        g = out[-1] if out else None
        if g and (g.gpu, g.zone) == (node.gpu, node.zone) and g.first_node + g.nodes == node.index:
            out[-1] = Group(g.gpu, g.zone, g.first_node, g.nodes + 1, max(g.nproc, node.nproc))
        else:
            out.append(Group(node.gpu, node.zone, node.index, 1, node.nproc))
    return out


def _torchrun(layout, node_rank: str, nproc: str, plan_path: str, train_args: list[str], port: int) -> str:
    args = " ".join(shlex.quote(a) for a in train_args)
    return (f"torchrun --nnodes={len(layout.nodes)} --node-rank={node_rank} --nproc-per-node={nproc} "
            f"--master-addr=\"$MASTER_ADDR\" --master-port={port} -m sailor_ext.train --plan {shlex.quote(plan_path)}"
            + (f" {args}" if args else ""))


def slurm(layout, plan_path: str, train_args: list[str], port: int = 29500, job: str = "sailor") -> str:
    """A heterogeneous Slurm batch job: one component per node group."""
    gs = groups(layout)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", "#SBATCH --output=%x-%j.out"]
    for i, g in enumerate(gs):
        if i:
            lines.append("#SBATCH hetjob")
        lines += [f"#SBATCH --nodes={g.nodes}", "#SBATCH --ntasks-per-node=1", f"#SBATCH --gres=gpu:{g.nproc}",
                  f"#SBATCH --constraint={g.gpu}"]
    lines += ["", "set -euo pipefail",
              "# node 0 of the first component hosts the rendezvous",
              'MASTER_ADDR=$(scontrol show hostnames "${SLURM_JOB_NODELIST_HET_GROUP_0:-$SLURM_JOB_NODELIST}" '
              "| head -n1)", "export MASTER_ADDR"]
    for i, g in enumerate(gs):
        het = f" --het-group={i}" if len(gs) > 1 else ""
        cmd = _torchrun(layout, f"$(( {g.first_node} + SLURM_NODEID ))", str(g.nproc), plan_path, train_args, port)
        lines.append(f"srun{het} --nodes={g.nodes} --ntasks-per-node=1 bash -c {shlex.quote(cmd)} &")
    lines += ["wait", ""]
    return "\n".join(lines)


def skypilot(layout, plan_path: str, train_args: list[str], port: int = 29500, cloud: str = "gcp",
             spot: bool = False) -> str:
    """SkyPilot task YAML: one task (document) per node group. Launch them together and set MASTER_ADDR
    of every task to the head node of the first (its `sky status --ip`)."""
    import yaml

    docs = []
    for i, g in enumerate(groups(layout)):
        accel = SKYPILOT_GPU.get(g.gpu)
        if accel is None:
            raise SailorError(f"no SkyPilot accelerator name for {g.gpu}; known: {', '.join(sorted(SKYPILOT_GPU))}")
        cmd = _torchrun(layout, f"$(( {g.first_node} + SKYPILOT_NODE_RANK ))", str(g.nproc), plan_path, train_args,
                        port)
        docs.append({
            "name": f"sailor-{i}-{g.gpu.lower()}-{g.zone}",
            "resources": {"cloud": cloud, "zone": g.zone, "accelerators": f"{accel}:{g.nproc}", "use_spot": spot,
                          "image_id": f"docker:{IMAGE}"},
            "num_nodes": g.nodes,
            "envs": {"MASTER_ADDR": "", "SAILOR_PLAN": plan_path},
            "run": cmd + "\n",
        })
    return yaml.safe_dump_all(docs, sort_keys=False)


def kubernetes(layout, plan_path: str, train_args: list[str], port: int = 29500, image: str = IMAGE) -> str:
    """Kubeflow PyTorchJobs: one per node group.

    A plan on one node group runs elastically (c10d rendezvous; any pod can be
    any node, the operator's elasticPolicy restarts and resizes it). A plan on
    several groups pins node ranks instead: node i must run on a GPU of the
    type and zone the plan gave it, so every pod computes its node rank from
    its group's first node and its replica index (downward API).
    """
    import copy

    import yaml

    gs = groups(layout)
    elastic = len(gs) == 1
    train = " ".join(shlex.quote(a) for a in ["--plan", plan_path, *train_args])
    jobs = []
    for i, g in enumerate(gs):
        def template(first_rank: int) -> dict:
            if elastic:
                run = (f"torchrun --nnodes={g.nodes} --nproc-per-node={g.nproc} --rdzv-backend=c10d "
                       f"--rdzv-endpoint=sailor-0-master-0:{port} --rdzv-id=sailor -m sailor_ext.train {train}")
            else:
                run = (f"torchrun --nnodes={len(layout.nodes)} --node-rank=$(( {first_rank} + REPLICA_INDEX )) "
                       f"--nproc-per-node={g.nproc} --master-addr=sailor-0-master-0 --master-port={port} "
                       f"-m sailor_ext.train {train}")
            selector = {"topology.kubernetes.io/zone": g.zone}
            if g.gpu in GKE_GPU:
                selector["cloud.google.com/gke-accelerator"] = GKE_GPU[g.gpu]
            env = [{"name": "REPLICA_INDEX", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.labels['training.kubeflow.org/replica-index']"}}}]
            container = {"name": "pytorch", "image": image, "command": ["bash", "-c", run], "env": env,
                         "resources": {"limits": {"nvidia.com/gpu": str(g.nproc)}}}  # quantities are strings
            return {"metadata": {"labels": {"app": "sailor", "sailor/group": str(i)}},
                    "spec": {"containers": [container], "nodeSelector": selector}}

        specs = {}
        workers = g.nodes
        if i == 0:
            specs["Master"] = {"replicas": 1, "restartPolicy": "OnFailure", "template": template(0)}
            workers -= 1
        if workers:
            specs["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure",
                               "template": template(g.first_node + (1 if i == 0 else 0))}
        spec: dict = {"pytorchReplicaSpecs": specs}
        if elastic:
            spec = {"elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": g.nodes, "maxReplicas": g.nodes,
                                      "nProcPerNode": g.nproc, "maxRestarts": 10}, **spec}
        jobs.append({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                     "metadata": {"name": f"sailor-{i}", "labels": {"app": "sailor"}}, "spec": copy.deepcopy(spec)})
    return yaml.safe_dump_all(jobs, sort_keys=False)


def megatron_model_args(model) -> list[str]:
    """Megatron-LM's arguments for the architecture of `model` beyond its sizes (defaults: GPT's)."""
    def refuse(what: str) -> None:
        raise SailorError(f"{model.name} uses {what}, which stock Megatron-LM's arguments cannot express; train it "
                          "with sailor's runtime")

    if model.post_norm:
        refuse("a norm after each residual add (post-LN)")
    if model.projected:
        refuse(f"a {model.word_dim}-wide word embedding projected to {model.hidden}")
    if any(model.windows):
        refuse("sliding-window attention")
    if model.attention_scale:
        refuse(f"attention scaled by {model.attention_scale:g} instead of 1/sqrt(head_dim)")
    if not model.final_norm:
        refuse("no norm before the head")
    args = []
    if model.rms_norm:
        args.append("--normalization RMSNorm")
    if model.norm_eps != 1e-5:
        args.append(f"--norm-epsilon {model.norm_eps:g}")
    if model.gated_mlp and model.activation == "silu":
        args.append("--swiglu")
    elif model.gated_mlp or model.activation not in ("gelu", "gelu_tanh"):
        refuse(f"a{' gated' if model.gated_mlp else ''} {model.activation} MLP")
    elif model.activation == "gelu_tanh":
        args.append("--openai-gelu")
    if not model.learned_positions:
        args += ["--position-embedding-type rope", f"--rotary-base {model.rope_theta:g}"]
        scaling = dict(model.rope_scaling)
        if scaling.get("type") == "linear" and float(scaling["factor"]).is_integer():
            args.append(f"--rotary-seq-len-interpolation-factor {int(scaling['factor'])}")
        elif scaling.get("type") == "llama3" and (scaling["low_freq_factor"], scaling["high_freq_factor"],
                                                  scaling["original_max_position_embeddings"]) == (1, 4, 8192):
            args += ["--use-rope-scaling", f"--rotary-scaling-factor {scaling['factor']:g}"]
        elif scaling:
            refuse(f"rotary scaling {scaling}")
    if model.num_query_groups != model.heads:
        args += ["--group-query-attention", f"--num-query-groups {model.num_query_groups}"]
    if model.head_dim_override:
        args.append(f"--kv-channels {model.head_dim}")
    biases = (model.qkv_bias, model.out_bias, model.mlp_bias)
    if biases == (True, False, False):
        args += ["--disable-bias-linear", "--add-qkv-bias"]
    elif biases == (False, False, False):
        args.append("--disable-bias-linear")
    elif biases != (True, True, True):
        refuse("biases on some linear layers only")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args


def megatron_lm(plan, model, port: int = 29500) -> str:
    """Stock Megatron-LM arguments for a homogeneous plan, to compare with sailor's runtime."""
    reps = {r for s in plan.stages for r in s.replicas}
    tps = {r.tp for r in reps}
    shares = set(plan.pipelines)
    if len({r.gpu for r in reps}) != 1 or len(tps) != 1 or len(shares) != 1:
        raise SailorError("Megatron-LM runs one GPU type, one TP degree and one microbatch size and count; this "
                          "plan mixes them, so it has no Megatron-LM equivalent (use sailor's runtime)")
    tp, pp, dp = tps.pop(), plan.pp, plan.dp
    blocks = model.num_blocks
    if blocks % pp:
        raise SailorError(f"Megatron-LM splits {blocks} blocks evenly; {pp} stages do not divide them")
    mbs = plan.pipelines[0].microbatch_size
    args = [
        f"--tensor-model-parallel-size {tp}", f"--pipeline-model-parallel-size {pp}",
        f"--num-layers {blocks}", f"--hidden-size {model.hidden}", f"--num-attention-heads {model.heads}",
        f"--ffn-hidden-size {model.ffn_hidden}", f"--seq-length {model.seq_len}",
        f"--max-position-embeddings {model.context_length}", *megatron_model_args(model),
        f"--micro-batch-size {mbs}", f"--global-batch-size {plan.global_batch_size}",
    ]
    recomputing = {s.recompute for s in plan.stages}
    if len(recomputing) != 1:
        raise SailorError("Megatron-LM recomputes on every stage or none; this plan recomputes on some stages only "
                          "(use sailor's runtime)")
    if recomputing.pop():  # every block, one block per checkpoint: what sailor's runtime does
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    world = tp * pp * dp
    return (f"# {model.name}: TP {tp} x PP {pp} x DP {dp} = {world} GPUs; Megatron splits the {blocks} blocks "
            f"evenly (sailor's split may differ)\n"
            f"torchrun --nproc-per-node=<GPUs per node> --nnodes=<nodes> --master-port={port} pretrain_gpt.py \\\n  "
            + " \\\n  ".join(args) + "\n")
