"""Where every rank of a plan runs, and the torchrun command that starts it.

The rank layout is a pure function of the plan (and the cluster's GPUs per
node), so the launcher, every training rank and the simulator agree on it
without talking to each other:

  * nodes: the simulator's placement rule (planner.simulator.placement):
    one GPU type and zone per node, a TP group never spans nodes, a
    pipeline's stages share a node where they fit.
  * ranks: node by node; inside a node by pipeline, then stage, then TP rank. torchrun numbers ranks the same way (node rank, then local rank), so
    `--nproc-per-node` may differ between nodes.

The plan's precision, if it records one, goes to every rank as its flag
(--bf16, --fp16 or --no-bf16: planner/specs/precision.py), whatever the target;
so does --use-distributed-optimizer where the plan's memory counts on it.

Nothing here imports torch: `sailor launch` runs on the planner's machine.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass

from planner import flags
from planner.errors import SailorError
from planner.outputs import check_output, write_output
from planner.simulator.placement import place
from planner.specs.hardware import Cluster, load_cluster
from planner.specs.model import ModelSpec
from planner.specs.plan import Pipeline, Plan, Replica, Stage, check_plan_for, load_plan, plan_model, with_model
from planner.specs.precision import check_precision, launch_flags
from planner.trainer_output import run_trainer

DISTRIBUTED_OPTIMIZER = "--use-distributed-optimizer"  # the runtime's flag (sailor_ext/train.py, Megatron-LM's)


@dataclass(frozen=True)
class RankSlot:
    """What one global rank does: its place in the plan and on the nodes."""

    rank: int
    stage: int
    replica: int  # = the pipeline it belongs to
    tp_rank: int
    tp: int
    gpu: str
    zone: str
    node: int
    local_rank: int


@dataclass(frozen=True)
class Node:
    """One machine: GPUs of one type in one zone, running consecutive ranks."""

    index: int
    gpu: str
    zone: str
    first_rank: int
    nproc: int

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)


@dataclass(frozen=True)
class Layout:
    plan: Plan
    slots: tuple[RankSlot, ...]  # indexed by global rank
    nodes: tuple[Node, ...]

    @property
    def world_size(self) -> int:
        return len(self.slots)

    def rank(self, stage: int, replica: int, tp_rank: int = 0) -> int:
        return self._index[(stage, replica, tp_rank)]

    def tp_group(self, stage: int, replica: int) -> tuple[int, ...]:
        """Global ranks of the TP group of `replica` of `stage`, by TP rank."""
        tp = self.plan.stages[stage].replicas[replica].tp
        return tuple(self.rank(stage, replica, t) for t in range(tp))

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        return tuple(r for k in range(self.plan.dp) for r in self.tp_group(stage, k))

    @property
    def _index(self) -> dict[tuple[int, int, int], int]:
        cached = self.__dict__.get("_cached_index")
        if cached is None:
            cached = {(s.stage, s.replica, s.tp_rank): s.rank for s in self.slots}
            object.__setattr__(self, "_cached_index", cached)
        return cached


def rank_layout(plan: Plan, cluster: Cluster | None = None) -> Layout:
    """The global rank, node and local rank of every (stage, replica, TP rank)."""
    cluster = cluster or Cluster()
    placed = place(plan, cluster)
    members: dict[int, list[tuple[int, int]]] = {}  # node -> [(stage, replica)] in placement order
    for k in range(plan.dp):
        for s in range(plan.pp):
            members.setdefault(placed[s][k], []).append((s, k))
    slots, nodes, rank = [], [], 0
    for node in sorted(members):
        first = rank
        for s, k in members[node]:
            r = plan.stages[s].replicas[k]
            for t in range(r.tp):
                slots.append(RankSlot(rank, s, k, t, r.tp, r.gpu, r.zone, node, rank - first))
                rank += 1
        s0, k0 = members[node][0]
        r0 = plan.stages[s0].replicas[k0]
        nodes.append(Node(node, r0.gpu, r0.zone, first, rank - first))
    return Layout(plan, tuple(slots), tuple(nodes))


# -- checks the runtime needs beyond Plan.check ---------------------------------
def check_tp(model: ModelSpec, tp: int, where: str = "plan") -> None:
    """The runtime's tensor parallelism splits the heads, the query groups and the FFN width evenly."""
    parts = {"attention heads": model.heads, "query groups": model.num_query_groups, "FFN width": model.ffn_hidden}
    if model.num_query_groups == model.heads:
        del parts["query groups"]  # multi-head attention: one group per head
    bad = [f"{n} {what}" if what != "FFN width" else f"FFN width {n}" for what, n in parts.items() if n % tp]
    if bad:
        raise SailorError(f"{where}: TP {tp} does not divide {model.name}'s {' and '.join(bad)}; use a TP degree "
                          f"that does: {', '.join(map(str, model.tp_degrees(tp)))}")


def check_runnable(plan: Plan, model: ModelSpec, cluster: Cluster | None = None) -> None:
    """Raise SailorError if the runtime cannot execute `plan` for `model`."""
    plan.check(num_layers=model.num_layers, cluster=cluster)
    for i, stage in enumerate(plan.stages):
        for tp in sorted({r.tp for r in stage.replicas}):
            check_tp(model, tp, f"plan: stage {i}")


def uniform_plan(model: ModelSpec, world_size: int, tp: int, pp: int, global_batch_size: int,
                 micro_batch_size: int, gpu: str = "CPU", zone: str = "local") -> Plan:
    """The plan Megatron's own arguments describe: equal stages, equal replicas."""
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise SailorError(f"world size {world_size} is not a multiple of TP {tp} x PP {pp}; "
                          "change --tensor-model-parallel-size/--pipeline-model-parallel-size or the process count")
    dp = world_size // (tp * pp)
    if pp > model.num_layers:
        raise SailorError(f"PP {pp} exceeds the {model.num_layers} layers of {model.name}")
    if global_batch_size % (micro_batch_size * dp):
        raise SailorError(f"global batch {global_batch_size} is not a multiple of micro batch {micro_batch_size} "
                          f"x data-parallel size {dp}; adjust --global-batch-size")
    size, extra = divmod(model.num_layers, pp)
    stages, first = [], 0
    for s in range(pp):
        last = first + size + (s < extra) - 1
        stages.append(Stage(first, last, (Replica(gpu, tp, zone),) * dp))
        first = last + 1
    n = global_batch_size // (micro_batch_size * dp)
    return with_model(Plan(model.name, global_batch_size, tuple(stages), (Pipeline(micro_batch_size, n),) * dp), model)


# -- torchrun command lines ----------------------------------------------------
def node_commands(layout: Layout, plan_path: str, train_args: list[str], master_addr: str,
                  master_port: int) -> list[list[str]]:
    """One torchrun command (argv) per node."""
    out = []
    for node in layout.nodes:
        out.append([
            "torchrun", f"--nnodes={len(layout.nodes)}", f"--node-rank={node.index}",
            f"--nproc-per-node={node.nproc}", f"--master-addr={master_addr}", f"--master-port={master_port}",
            "-m", "sailor_ext.train", "--plan", plan_path, *train_args,
        ])
    return out


def local_command(layout: Layout, plan_path: str, train_args: list[str], master_port: int) -> list[str]:
    """All ranks on this machine, one torchrun."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={layout.world_size}",
            "--master-addr=127.0.0.1", f"--master-port={master_port}",
            "-m", "sailor_ext.train", "--plan", plan_path, *train_args]


TARGETS = ("torchrun", "slurm", "skypilot", "k8s", "megatron-lm")
MASTER_ADDR = "$MASTER_ADDR"  # --master-addr's default: node 0's address from each node's environment
# how each other target finds node 0 (planner/targets), so --master-addr would be ignored there
OWN_MASTER = {"slurm": "the Slurm script finds node 0's address itself (scontrol)",
              "skypilot": "the SkyPilot tasks find group 0's head node themselves (sky launch --env MASTER_ADDR=...)",
              "k8s": "the PyTorchJobs reach node 0 by its pod's name",
              "megatron-lm": "the Megatron-LM script reads MASTER_ADDR from each node's environment"}
HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")
VARIABLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def _launch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="torchrun", choices=TARGETS,
                   help="what to write: torchrun command lines (default), a Slurm batch script, SkyPilot task "
                        "YAML (one file per node group), a Kubernetes manifest (ConfigMap + PyTorchJobs), or a "
                        "stock Megatron-LM pretrain_gpt.py script (docs/deploy.md)")
    p.add_argument("-o", "--output", help="write it to this file instead of printing")
    p.add_argument("--cluster", help="cluster file (GPUs per node of custom GPU types); every rank gets it too")
    p.add_argument("--master-addr", default=MASTER_ADDR, help="host of node 0 (default: $MASTER_ADDR)")
    p.add_argument("--master-port", type=flags.integer(1, 65535), default=29500,  # (not 0: any port, on each node)
                   help="port of node 0's rendezvous (default 29500)")
    p.add_argument("--local", action="store_true", help="run every rank on this machine now")


def add_parser(subparsers, add_common=None) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "launch", help="print (or run) how to start a plan: torchrun per node, Slurm, SkyPilot, Kubernetes",
        description="Print the torchrun command line that starts each node of a plan; arguments after '--' "
                    "go to sailor_ext.train, e.g. sailor launch plan.json --local -- --train-iters 100.")
    p.add_argument("plan", help="plan file (sailor-plan JSON or Sailor's format)")
    _launch_options(p)
    # argparse cannot put options after a positional followed by free arguments,
    # so everything after the plan is collected here and split at '--' in run().
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="[options] -- TRAIN_ARGS",
                   help="arguments for sailor_ext.train, after '--'")
    p.set_defaults(func=run)
    return p


def _split_rest(args) -> list[str]:
    """Apply launch options found after the plan; return the training arguments."""
    rest = list(args.rest or [])
    cut = rest.index("--") if "--" in rest else len(rest)
    if cut:
        options = flags.Parser(prog="sailor launch", add_help=False)  # issue 18: one-line usage errors
        _launch_options(options)
        known, unknown = options.parse_known_args(rest[:cut])
        if unknown:
            raise SailorError(f"sailor launch: unknown option {unknown[0]!r}; put training arguments after '--'")
        defaults = options.parse_args([])
        for key, value in vars(known).items():
            if value != getattr(defaults, key):
                setattr(args, key, value)
    return rest[cut + 1:]


def _check_master_addr(args) -> None:
    """--master-addr goes into a shell line unquoted (a $VARIABLE must expand on the node): only a host, an IP
    or one variable, and only for the target that uses it."""
    addr = args.master_addr
    if addr == MASTER_ADDR:
        return
    if args.local or args.target != "torchrun":
        how = "--local runs every rank here (127.0.0.1)" if args.local else OWN_MASTER[args.target]
        raise SailorError(f"--master-addr is for --target torchrun; {how}: drop the flag")
    try:
        ipaddress.ip_address(addr)
        return
    except ValueError:
        pass
    if len(addr) > 253 or not (HOST.fullmatch(addr) or VARIABLE.fullmatch(addr)):
        raise SailorError(f"--master-addr {shlex.quote(addr)} must be a host name or one $VARIABLE")


def _train_file_flag(arg: str) -> bool:
    """--plan/--cluster in the training arguments, also as --plan=FILE or a prefix argparse takes for it."""
    name = arg.split("=", 1)[0]
    return (len(name) >= 4 and "--plan".startswith(name)) or (len(name) >= 5 and "--cluster".startswith(name))


def _check_train_args(rank_args: list[str], local: bool, plan: Plan, cluster: Cluster) -> list[str]:
    """What every rank gets, parsed and held against the plan as sailor_ext.train will (batch sizes, model,
    uniform-plan flags), so a bad flag is one line here, not one per rank. A printed launch file may leave
    out --train-iters (the user completes it; a stand-in satisfies the parser); a run here may not.
    Returns the paths the ranks read or write (sailor_ext.train.input_paths)."""
    from sailor_ext.train import check_plan_flags, check_train_args, input_paths  # torch-free; they import this

    if local and not any(a == "--train-iters" or a.startswith("--train-iters=") for a in rank_args):
        raise SailorError("sailor launch --local needs the number of training steps: add -- --train-iters N at the "
                          "end")
    parsed = check_train_args(rank_args if local else ["--train-iters", "1", *rank_args])  # (a later one wins)
    paths = input_paths(parsed)
    if parsed.model and ("/" in parsed.model or parsed.model.endswith(".json")) and not os.path.exists(parsed.model):
        parsed.model = None  # a config.json on the nodes only: each rank reads it there
    try:
        model = check_plan_flags(parsed, plan)
        if parsed.model:  # (the plan's own model was checked already)
            check_runnable(plan, model, cluster)
    except SailorError as e:
        raise SailorError(f"bad training arguments after '--': {e}") from None
    return paths


def _check_port_free(port: int) -> None:
    """torchrun's rendezvous listens on --master-port; when that port is taken it dies with a 40-line
    traceback, so --local tries the port first (SO_REUSEADDR as torch does: only a listener counts)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            raise SailorError(f"--master-port {port} is not free on this machine ({e.strerror}): another job may "
                              "hold it; pick a free port with --master-port N") from None


def run(args) -> int:
    train_args = _split_rest(args)  # first: options after the plan (--cluster among them) count too
    _check_master_addr(args)
    if args.output == "":
        raise SailorError("-o '' is empty; give a file name, or leave -o out to print")
    plan = load_plan(args.plan)
    if not os.path.isfile(args.plan):  # e.g. <(...): gone by the time the ranks start and read it
        raise SailorError(f"plan file {args.plan} is a pipe or device, which the ranks cannot read once launch has "
                          "returned; save the plan to a file and launch that")
    train_args = launch_flags(plan.precision, train_args)  # the runtime trains in the plan's precision
    if plan.distributed_optimizer and DISTRIBUTED_OPTIMIZER not in train_args:
        train_args = [DISTRIBUTED_OPTIMIZER, *train_args]  # the plan's memory counts on it
    cluster = load_cluster(args.cluster)
    model = plan_model(plan)
    check_plan_for(plan, model, cluster, f"plan file {args.plan}")  # issue 18: zones, GPU types, TP (validation)
    if plan.precision:  # what `sailor simulate` refuses is not launched either (bf16 on a V100)
        check_precision(plan.precision, [cluster.gpu(g) for g in sorted({r.gpu for s in plan.stages
                                                                          for r in s.replicas})], "plan")
    check_runnable(plan, model, cluster)
    layout = rank_layout(plan, cluster)
    if any(_train_file_flag(a) for a in train_args):
        raise SailorError("give the plan and the cluster file to sailor launch (--cluster FILE "
                          "before '--'); it passes them on to every rank")
    # every rank computes the layout itself: from the same plan and cluster file
    rank_args = [*(["--cluster", args.cluster] if args.cluster else []), *train_args]
    # (megatron-lm takes a subset of these options, so its values get the runtime's ranges too)
    inputs = (args.plan, args.cluster, *_check_train_args(["--plan", args.plan, *rank_args], args.local, plan,
                                                         cluster))
    if args.output:  # issue 18: never over the plan, the cluster file, or what the ranks read or write
        check_output(args.output, inputs, "launch file (-o)")
    if args.local:
        _check_port_free(args.master_port)
        env = dict(os.environ)
        if plan.stages[0].replicas[0].gpu == "CPU":
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // layout.world_size)))
        cmd = local_command(layout, args.plan, rank_args, args.master_port)
        print(" ".join(shlex.quote(c) for c in cmd), flush=True)
        return run_trainer(cmd, env)  # issue 18: the trainer's one-line error last, not torchrun's report
    if args.target == "torchrun":
        lines = []
        for node, cmd in zip(layout.nodes, node_commands(layout, args.plan, rank_args, args.master_addr,
                                                         args.master_port)):
            lines.append(f"# node {node.index}: {node.nproc} x {node.gpu} in {node.zone}, "
                         f"ranks {node.first_rank}..{node.first_rank + node.nproc - 1}")
            lines.append(" ".join(c if c.startswith("--master-addr=$") else shlex.quote(c) for c in cmd))
        return _write(args.output, "\n".join(lines) + "\n")
    from planner.targets import Inputs

    files = Inputs(args.plan, args.cluster)
    if args.target == "slurm":
        from planner.targets.slurm import slurm

        return _write(args.output, slurm(layout, files, train_args, args.master_port))
    if args.target == "k8s":
        from planner.targets.kubernetes import kubernetes

        return _write(args.output, kubernetes(layout, files, train_args, args.master_port))
    if args.target == "megatron-lm":
        from planner.targets.megatron_lm import megatron_lm

        return _write(args.output, megatron_lm(plan, model, layout, train_args, args.master_port))
    from planner.targets.skypilot import launch_commands, skypilot

    tasks = skypilot(layout, files, train_args, args.master_port)
    if len(tasks) == 1:
        return _write(args.output, tasks[0])
    if not args.output:
        raise SailorError(f"this plan runs on {len(tasks)} node groups (GPU types or zones), one SkyPilot cluster "
                          "each: give -o FILE.yaml, and sailor writes FILE-0.yaml, FILE-1.yaml, ...")
    stem, dot, ext = args.output.rpartition(".")
    stem, ext = (stem, "." + ext) if dot and "/" not in ext else (args.output, ".yaml")
    files = [f"{stem}-{i}{ext}" for i in range(len(tasks))]
    for f in files:  # all checked before any is written
        check_output(f, inputs, f"launch file (from -o {args.output})")
    for f, text in zip(files, tasks):
        _write(f, text)
    print(f"# {len(tasks)} SkyPilot tasks, one cluster per node group; launch group 0 first, then the others "
          "pointed at its head node:")
    print("\n".join(launch_commands(files)))
    return 0


def _write(path: str | None, text: str) -> int:
    if path:
        write_output(path, text, what="launch file (-o)")  # issue 18: atomic
    else:
        sys.stdout.write(text)
    return 0

