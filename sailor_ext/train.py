"""Train a model on a plan: `torchrun ... -m sailor_ext.train --plan plan.json`.

Arguments follow Megatron's names. Without --plan, the plan is the uniform
one Megatron's own arguments describe (--tensor-model-parallel-size,
--pipeline-model-parallel-size, --global-batch-size, --micro-batch-size over
the torchrun world). With --plan, the plan fixes the batch sizes and the
batch-size arguments, if given, must agree with it.

User mistakes (plan vs world size, layer ranges, bad files, a rank on the
wrong node) print one line, `sailor: error: ...`, from the rank that found
them (a mistake every rank of a node shares: from its local rank 0), and end
every rank at once with exit 2 before any process group forms
(sailor_ext/startup.py). A peer that
dies or hangs makes the collectives fail after --dist-timeout seconds with
one line naming the rank, and exit 3; the last complete checkpoint stays
intact.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from dataclasses import replace

from planner import flags
from planner.errors import SailorError
from planner.flags import Parser, integer, number
from planner.launch import Layout, check_runnable, rank_layout, uniform_plan
from planner.specs.hardware import load_cluster
from planner.specs.model import ModelSpec, get_model
from planner.specs.plan import MAX_LAYERS, MAX_TP, Plan, load_plan, plan_model
from sailor_ext.data import DEFAULT_SPLIT, EVAL_ITERS, DataSources, open_training_data, parse_blend, parse_split
from sailor_ext.precision import precision_config

PEER_FAILURE_EXIT = 3
MAX_ITERS = 1 << 40  # steps, intervals, warm-up: beyond any run
path = flags.nonempty("a path")  # an empty one was taken as not given (--load '' trained from scratch)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="python -m sailor_ext.train", description=__doc__.splitlines()[0])
    g = p.add_argument_group("plan and model")
    g.add_argument("--plan", type=path, help="plan file; without it a uniform plan is built from the parallel sizes "
                   "below")
    g.add_argument("--model", type=path, help="model preset or config.json (default: the plan's model)")
    g.add_argument("--cluster", type=path, help="cluster file (for GPU types not in the catalog)")
    g.add_argument("--tensor-model-parallel-size", type=integer(1, MAX_TP), help="without --plan (default 1)")
    g.add_argument("--pipeline-model-parallel-size", type=integer(1, MAX_LAYERS), help="without --plan (default 1)")
    g.add_argument("--gpu-type", type=flags.nonempty("a GPU type"),
                   help="GPU type of a plan built from the parallel sizes (a label; "
                   "the node size comes from torchrun; default CPU)")
    g.add_argument("--seq-length", type=flags.seq_length, help="sequence length (default: the model's)")
    g.add_argument("--make-vocab-size-divisible-by", type=integer(1, 1 << 16), default=128,
                   help="pad the vocabulary to a multiple of this times the plan's largest TP degree")
    g = p.add_argument_group("batch and schedule")
    g.add_argument("--global-batch-size", type=flags.batch)
    g.add_argument("--micro-batch-size", type=flags.batch)
    g.add_argument("--train-iters", type=integer(1, MAX_ITERS), required=True)
    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="adam is AdamW")
    g.add_argument("--sgd-momentum", type=number(0.0, 1.0), default=0.9)
    g.add_argument("--lr", type=number(0.0), default=1e-3)
    g.add_argument("--min-lr", type=number(0.0), default=0.0)
    g.add_argument("--lr-warmup-iters", type=integer(0, MAX_ITERS), default=0)
    g.add_argument("--lr-decay-iters", type=integer(0, MAX_ITERS), default=0)
    g.add_argument("--lr-decay-style", choices=("constant", "linear", "cosine"), default="constant")
    g.add_argument("--weight-decay", type=number(0.0), default=0.01)
    g.add_argument("--adam-beta1", type=number(0.0, below=1.0), default=0.9)
    g.add_argument("--adam-beta2", type=number(0.0, below=1.0), default=0.95)
    g.add_argument("--adam-eps", type=number(0.0), default=1e-8)
    g.add_argument("--clip-grad", type=number(0.0), default=1.0, help="global gradient-norm clip (0: off)")
    g = p.add_argument_group("mixtures of experts (sailor_ext/moe.py)")
    g.add_argument("--moe-aux-loss-coeff", type=number(0.0, 1e3), default=0.0,
                   help="weight of the per-sequence load-balancing loss of each MoE block, as Megatron-LM's "
                        "seq_aux_loss (default 0: off; 1e-3 to 1e-2 is usual)")
    g.add_argument("--moe-z-loss-coeff", type=number(0.0, 1e3), default=0.0,
                   help="weight of the router z-loss of each MoE block, logsumexp(router logits)^2 per token "
                        "(ST-MoE; default 0: off; 1e-3 is usual)")
    g.add_argument("--moe-router-bias-update-rate", type=number(0.0, 1.0), default=0.0,
                   help="after each step, move every expert's score bias (DeepSeek-V3's auxiliary-loss-free "
                        "balancing) by this toward an even load of the global batch, as Megatron-LM's flag "
                        "(default 0: fixed, as transformers keeps them; DeepSeek-V3 trained with 1e-3)")
    g = p.add_argument_group("precision (sailor_ext/precision.py)")
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 parameters and activations, fp32 main gradients and master weights (default: the "
                   "plan's precision if it records one, else on with CUDA, off on CPU)")
    g.add_argument("--fp16", action="store_true", help="fp16 parameters and activations with loss scaling, fp32 "
                   "main gradients and master weights")
    g.add_argument("--loss-scale", type=number(above=0.0),
                   help="fp16: a constant loss scale (default: dynamic scaling)")
    g.add_argument("--initial-loss-scale", type=number(above=0.0), help="fp16: the first dynamic scale (default 2^32)")
    g.add_argument("--min-loss-scale", type=number(above=0.0),
                   help="fp16: the dynamic scale never goes below this (default 1)")
    g.add_argument("--loss-scale-window", type=flags.positive,
                   help="fp16: clean steps in a row before the scale doubles (default 1000)")
    g.add_argument("--hysteresis", type=flags.positive,
                   help="fp16: overflowing steps (without a clean window between) before "
                   "the scale halves (default 2); every overflowing step is skipped")
    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", metavar="PREFIX",
                   help="megatron indexed dataset (PREFIX.bin + PREFIX.idx, e.g. from `sailor data prepare`), or "
                   "weights and prefixes to blend: W1 PREFIX1 W2 PREFIX2 ...; default: synthetic data")
    g.add_argument("--split", default=DEFAULT_SPLIT,
                   help=f"train,validation,test shares of each dataset's documents (default {DEFAULT_SPLIT})")
    g.add_argument("--mock-data", action="store_true", help="synthetic data (the default without --data-path)")
    g.add_argument("--seed", type=integer(0, 2**32 - 1), default=1234)
    g = p.add_argument_group("validation")
    g.add_argument("--eval-interval", type=integer(1, MAX_ITERS),
                   help="validate every N steps and after the last (default: never)")
    g.add_argument("--eval-iters", type=integer(0, MAX_ITERS),
                   help=f"validation batches of the global batch size per evaluation (default {EVAL_ITERS} with "
                   "--eval-interval; without it: one evaluation, after the last step)")
    g = p.add_argument_group("checkpoints and logging")
    g.add_argument("--save", type=path,
                   help="checkpoint directory, or an fsspec URL (s3://bucket/prefix, gs://...) that every "
                   "node reaches: no shared filesystem needed; or, in `sailor run`, node:NAME: on each node's own "
                   "disk (its agent's --node-dir) with a copy on another node")
    g.add_argument("--save-interval", type=integer(0, MAX_ITERS), default=0, help="save every N steps (and at the end)")
    g.add_argument("--keep-checkpoints", type=integer(0, 1 << 20), default=3,
                   help="committed checkpoints to keep on disk (0: all); older ones are the fallback when the "
                   "newest is damaged")
    g.add_argument("--load", type=path,
                   help="resume from the newest checkpoint that verifies in this directory or URL")
    g.add_argument("--load-hf", type=path, metavar="DIR",
                   help="start from a Hugging Face model directory's safetensors "
                   "weights (sharded or not), cut to the plan; a checkpoint in --load, if any, wins")
    g.add_argument("--metrics-file", type=path, help="append one JSON line per step (rank 0)")
    g.add_argument("--log-interval", type=integer(0, MAX_ITERS), default=1)
    g.add_argument("--dist-timeout", type=flags.seconds, default=300.0,
                   help="seconds a collective may wait for a peer before the run fails")
    g.add_argument("--distributed-backend", choices=("nccl", "gloo"),
                   help="default: nccl with CUDA, gloo on CPU; gloo on CUDA lets ranks share a GPU (plans without "
                   "pipeline stages only: gloo cannot send CUDA tensors)")
    g = p.add_argument_group("gradient reduction (sailor_ext/grad_sync.py)")
    g.add_argument("--overlap-grad-reduce", action=argparse.BooleanOptionalAction, default=True,
                   help="start each gradient bucket's all-reduce as soon as the last microbatch's backward has "
                   "finished its gradients (default: on)")
    g.add_argument("--use-distributed-optimizer", action="store_true",
                   help="shard the optimizer state over the replicas (ZeRO-1, as Megatron's flag): gradients "
                   "reduce-scattered, each rank steps its part, the weights all-gathered")
    g.add_argument("--grad-bucket-numel", type=integer(1, 1 << 40), default=2**22,
                   help="elements per gradient bucket (default 2^22: 16 MiB of fp32)")
    g = p.add_argument_group("kernel fusion (CUDA only; sailor_ext/model.py KernelFusion)")
    g.add_argument("--no-bias-swiglu-fusion", dest="swiglu_fusion", action="store_false",
                   help="run SwiGLU as separate kernels (default on CUDA: one compiled kernel, megatron's)")
    g.add_argument("--no-rope-fusion", dest="rope_fusion", action="store_false",
                   help="run rotary positions as separate kernels (default on CUDA: one compiled kernel)")
    args = p.parse_args(argv)
    # contradictions between flags, refused as Megatron's own checks refuse them
    if args.min_lr > args.lr:
        p.error(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}: the schedule decays from --lr down to --min-lr")
    if args.lr_decay_style != "constant" and args.lr_decay_iters and args.lr_warmup_iters >= args.lr_decay_iters:
        p.error(f"--lr-warmup-iters {args.lr_warmup_iters} must be below --lr-decay-iters {args.lr_decay_iters}: "
                "the decay runs from the end of the warm-up to --lr-decay-iters")
    if args.mock_data and args.data_path:
        p.error("--mock-data and --data-path both choose the training data; give one")
    return args


def check_train_args(argv: list[str]) -> argparse.Namespace:
    """The training arguments as every rank will parse them, checked where the user gives them (sailor launch,
    sailor run): a mistake is one line there, not one per rank on the cluster."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # (--help's text)
            parsed = parse_args(argv)
    except flags.UsageError as e:  # one line (planner.flags.Parser): "argument --lr: must be ..."
        raise SailorError(f"bad training arguments after '--': {e.reason}") from None
    except SystemExit:
        raise SailorError("bad training arguments after '--': --help is not one; see "
                          "`python -m sailor_ext.train --help`") from None
    precision_config(parsed, cuda=False)  # --fp16 with --bf16 and the like
    try:  # the data flags' syntax (every rank's open_training_data reads the files themselves)
        if parsed.data_path:
            parse_blend(parsed.data_path)
        parse_split(parsed.split)
    except SailorError as e:
        raise SailorError(f"bad training arguments after '--': {e}") from None
    return parsed


def input_paths(args) -> list[str]:
    """The files and directories the ranks read or write: what a launch file must not be written over."""
    paths = [args.load, args.load_hf, args.save, args.metrics_file]
    if args.model and ("/" in args.model or args.model.endswith(".json")):
        paths.append(args.model)
    for prefix in parse_blend(args.data_path).prefixes if args.data_path else ():
        paths += [prefix, f"{prefix}.bin", f"{prefix}.idx"]
    return [x for x in paths if x]


# -- resolving the plan (no torch needed) -------------------------------------------
def check_plan_flags(args, plan: Plan) -> ModelSpec:
    """The flags that --plan decides, held against it (by every rank, and by sailor launch before it writes
    anything); the model that trains."""
    for flag, value in (("--tensor-model-parallel-size", args.tensor_model_parallel_size),
                        ("--pipeline-model-parallel-size", args.pipeline_model_parallel_size),
                        ("--gpu-type", args.gpu_type)):
        if value is not None:  # (it was ignored)
            raise SailorError(f"{flag} builds a uniform plan, but --plan {args.plan} gives the plan; drop {flag}")
    model = plan_model(plan, args.model, args.seq_length)
    if args.global_batch_size is not None and args.global_batch_size != plan.global_batch_size:
        raise SailorError(f"--global-batch-size {args.global_batch_size} disagrees with the plan's global batch "
                          f"{plan.global_batch_size}; drop the flag")
    sizes = {p.microbatch_size for p in plan.pipelines}
    if args.micro_batch_size is not None and sizes != {args.micro_batch_size}:
        raise SailorError(f"--micro-batch-size {args.micro_batch_size} disagrees with the plan's microbatch "
                          f"sizes {sorted(sizes)}; drop the flag (the plan sets them per pipeline)")
    check_model_flags(args, model)
    return model


def check_model_flags(args, model: ModelSpec) -> None:
    """The flags that only some models take."""
    for flag, value in (("--moe-aux-loss-coeff", args.moe_aux_loss_coeff),
                        ("--moe-z-loss-coeff", args.moe_z_loss_coeff)):
        if value and not model.experts:
            raise SailorError(f"{flag} weighs a loss on the router of a mixture of experts, and {model.name} has "
                              "none; drop the flag")
    if args.moe_router_bias_update_rate and not model.expert_score_bias:
        raise SailorError(f"--moe-router-bias-update-rate moves the expert score biases of a DeepSeek-V3 router, "
                          f"and {model.name} has none; drop the flag")


def resolve_plan(args, world_size: int) -> tuple[Plan, ModelSpec, Layout]:
    cluster = load_cluster(args.cluster)
    if args.plan:
        plan = load_plan(args.plan)
        model = check_plan_flags(args, plan)
    else:
        if not args.model:
            raise SailorError("give --plan plan.json, or --model with the parallel sizes for a uniform plan")
        model = get_model(args.model, seq_len=args.seq_length)
        check_model_flags(args, model)
        gbs = args.global_batch_size or world_size
        mbs = args.micro_batch_size or 1
        # torchrun's nodes are the plan's nodes: GPUs per node = processes per node
        local = env_int("LOCAL_WORLD_SIZE", str(world_size), 1, world_size)
        spec = cluster.gpu(args.gpu_type or "CPU")
        cluster = replace(cluster, gpus={**cluster.gpus, spec.name: replace(spec, gpus_per_node=local)})
        plan = uniform_plan(model, world_size, args.tensor_model_parallel_size or 1,
                            args.pipeline_model_parallel_size or 1, gbs, mbs, gpu=spec.name)
    check_runnable(plan, model, cluster)
    follow_plan_precision(args, plan)
    if plan.distributed_optimizer:  # the plan's memory counts on it (an elastic job's plans too)
        args.use_distributed_optimizer = True
    layout = rank_layout(plan, cluster)
    if layout.world_size != world_size:
        raise SailorError(f"the plan needs {layout.world_size} ranks but {world_size} were started; start "
                          f"{layout.world_size} processes (see `sailor launch {args.plan or 'PLAN'}`)")
    return plan, model, layout


def follow_plan_precision(args, plan: Plan) -> None:
    """A plan that records its precision (planner/specs/precision.py) sets --bf16/--fp16 when they are
    not given; flags that ask for another precision are refused (the plan's memory was made for its own)."""
    if plan.precision is None:
        return
    asked = "fp16" if args.fp16 else {True: "bf16", False: "fp32", None: None}[args.bf16]
    if asked is not None and asked != plan.precision:
        raise SailorError(f"the plan trains in {plan.precision} but the flags ask for {asked}; drop them, or make a "
                          f"plan for {asked} with `sailor plan --precision {asked}`")
    args.fp16, args.bf16 = plan.precision == "fp16", plan.precision == "bf16"


def check_placement(layout: Layout, rank: int) -> None:
    """With several torchrun nodes, each rank must run on the node the plan says."""
    nodes = env_int("GROUP_WORLD_SIZE", "1", 1, layout.world_size)
    if nodes <= 1:
        return
    slot = layout.slots[rank]
    group_rank, local_rank = env_int("GROUP_RANK", "0", 0, nodes - 1), env_int("LOCAL_RANK", "0", 0, layout.world_size)
    if (slot.node, slot.local_rank) != (group_rank, local_rank):
        node = layout.nodes[slot.node]
        raise SailorError(f"rank {rank} started as local rank {local_rank} of node {group_rank}, but the plan places "
                          f"it on node {slot.node}; start node {slot.node} with --node-rank={slot.node} "
                          f"--nproc-per-node={node.nproc} (see `sailor launch`)")


def check_metrics_file(args) -> None:
    """--metrics-file gets a JSON line appended per step: never to an input, a directory, or a file of another kind."""
    path = args.metrics_file
    if not path:
        return
    if os.path.isdir(path):
        raise SailorError(f"--metrics-file {path} is a directory; give a file, e.g. "
                          f"{os.path.join(path, 'metrics.jsonl')}")
    parent = os.path.dirname(path) or "."
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise SailorError(f"--metrics-file {path}: {parent} is not a directory")
    inputs = [(flag, f) for flag, f in (("--plan", args.plan), ("--cluster", args.cluster), ("--model", args.model))
              if f] + [("--data-path", p + ext) for p in args.data_path or () for ext in (".bin", ".idx")]
    for flag, f in inputs:
        if os.path.isfile(f) and os.path.exists(path) and os.path.samefile(f, path):
            raise SailorError(f"--metrics-file {path} is the {flag} file; metrics would be appended to it: give "
                              "another file")
    if os.path.isfile(path) and os.path.getsize(path):
        try:
            with open(path, "rb") as f:
                first = json.loads(f.readline(1 << 16))
        except (OSError, ValueError):
            first = None
        if not isinstance(first, dict):
            raise SailorError(f"--metrics-file {path} exists and is not a metrics file (its first line is not a JSON "
                              "object); give a new file, or one an earlier run wrote, to append to")


def check_save_dir(args, fresh: bool = False) -> None:
    """A local --save must be a directory or one to be made: a file there failed every save, after training.
    fresh: a run that does not resume from --save (torchrun's first attempt) must not write into a directory
    that holds another run's checkpoints: its saves replaced theirs and repointed `latest` (sailor run resumes
    from --save by itself, so it passes False)."""
    path = args.save
    if not path or "://" in path or path.startswith("node:"):
        return  # an object store, or each node's own disk: found at the first save
    here = os.path.abspath(path)
    while not os.path.exists(here):
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise SailorError(f"--save {path}: {here} is a file, not a directory; give a directory for the checkpoints")
    if not os.access(here, os.W_OK):
        raise SailorError(f"--save {path}: {here} is not writable here; give a directory this user can write")
    try:  # os.access says yes to root, also where nothing can be written (read-only mounts, /proc, squashed NFS)
        fd, probe = tempfile.mkstemp(prefix=".sailor-save-probe-", dir=here)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SailorError(f"--save {path}: cannot create a file in {here} ({e.strerror or e}); give a directory "
                          "this user can write") from None
    resumes = args.load and os.path.exists(args.load) and os.path.samefile(args.load, here)
    if fresh and here == os.path.abspath(path) and not resumes:
        held = sorted(n for n in os.listdir(here) if n == "latest" or (
            n.startswith("iter_") and os.path.isfile(os.path.join(here, n, "meta.json"))))
        if held:
            newest = held[-2] if len(held) > 1 and held[-1] == "latest" else held[-1]
            raise SailorError(f"--save {path} already holds checkpoints ({newest}) that this run would replace; "
                              f"resume them with --load {path}, or save to another directory")


def train(args, plan: Plan, model_spec: ModelSpec, layout: Layout, rank: int, local_rank: int,
          data: DataSources | None = None, store=None) -> int:
    """Join the process group and run the steps (imports torch and megatron)."""
    import torch.distributed as dist

    from sailor_ext.trainer import Trainer, init_distributed

    if store is None and layout.world_size == 1:  # one process: an in-process store, no MASTER_ADDR/PORT to need
        store = dist.HashStore()
    device = init_distributed(layout, rank, local_rank, args.dist_timeout, store, args.distributed_backend)
    trainer = Trainer(args, plan, model_spec, layout, rank, device, data=data)
    trainer.run()
    dist.barrier()
    dist.destroy_process_group()
    failure = trainer.save_failure
    if failure:  # trained, but what --save holds is not what the run did: not a success
        print(f"sailor: error: {failure}; the steps after the last committed checkpoint are not saved: fix --save, "
              "then resume with --load", file=sys.stderr, flush=True)
        return SailorError.exit_code
    return 0


def start(args, rank: int, world_size: int, local_rank: int):
    """This rank's checks, agreed with every other rank: (plan, model, layout, data, store), or an exit code.

    A failing rank says why in one line at once: a placement error is its own; an error in the plan or the
    data files is the same on every rank of a node, so local rank 0 says it. Every rank then learns from the
    store whether all passed (sailor_ext/startup.py) and stops at once if not.
    """
    error, own = None, False
    try:
        plan, model, layout = resolve_plan(args, world_size)
        own = True
        check_placement(layout, rank)
        own = False
        precision_config(args, cuda=False)  # flag mistakes now; the default (bf16 on CUDA) is decided per device
        if args.distributed_backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise SailorError("--distributed-backend nccl needs CUDA GPUs, and none is visible; use gloo on CPU")
        data = open_training_data(args, model)
        check_metrics_file(args)
        check_save_dir(args, fresh=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0")
    except SailorError as e:
        error = e
        if own or local_rank == 0:
            print(f"sailor: error: {e}", file=sys.stderr, flush=True)
    if world_size == 1:
        return error.exit_code if error else (plan, model, layout, data, None)
    from sailor_ext import startup

    if error is not None:  # tell the others, but never wait long for a store: this rank has said why
        try:
            store = startup.connect(rank, world_size, min(args.dist_timeout, startup.REPORT_TIMEOUT_S))
            startup.report(store, rank, str(error))
            if startup.hosts_store(rank):
                startup.linger(store, world_size, args.dist_timeout)
        except (RuntimeError, TimeoutError):
            pass
        return error.exit_code
    try:
        store = startup.connect(rank, world_size, args.dist_timeout)
        startup.report(store, rank, None)
        startup.wait_for_all(store, world_size, args.dist_timeout)
    except startup.PeerFailedAtStartup:
        if startup.hosts_store(rank):  # the others read the outcome from this rank's store
            startup.linger(store, world_size, args.dist_timeout)
        return SailorError.exit_code  # that rank said why
    except (RuntimeError, TimeoutError) as e:  # the store's host is gone: its node failed
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if not _resolves(host):
            print(f"sailor: error: rank {rank}: MASTER_ADDR {host[:80]!r} does not resolve to an address; set it to "
                  "node 0's host name or IP (`sailor launch --master-addr`)", file=sys.stderr, flush=True)
            return SailorError.exit_code
        where = f"{host}:{os.environ.get('MASTER_PORT')}"
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        print(f"sailor: error: rank {rank}: stopped at startup: the rendezvous store at {where} is gone or silent "
              f"({first}); another node failed, see its log", file=sys.stderr, flush=True)
        return SailorError.exit_code
    return plan, model, layout, data, store


def _resolves(host: str) -> bool:
    import socket

    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


def _is_peer_failure(error: BaseException) -> bool:
    text = str(error).lower()
    markers = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe", "nccl",
               "gloo", "socket", "peer")
    return any(m in text for m in markers)


def env_int(name: str, default: str, lo: int, hi: int) -> int:
    """An integer torchrun sets in the environment, checked into [lo, hi]."""
    text = os.environ.get(name, default)
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise SailorError(f"environment variable {name}={text[:40]!r} must be an integer from {lo} to {hi}; "
                          "start the ranks with torchrun (see `sailor launch`), which sets it")
    return value


def launch_environment() -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as torchrun sets them, checked: a rank outside the world waited forever."""
    world_size = env_int("WORLD_SIZE", "1", 1, 1 << 24)
    rank = env_int("RANK", "0", 0, world_size - 1)
    local_rank = env_int("LOCAL_RANK", "0", 0, world_size - 1)
    env_int("MASTER_PORT", "29500", 1, 65535)
    return rank, world_size, local_rank


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SailorError as e:  # every rank has the same flags: local rank 0 says it
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"sailor: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    try:
        rank, world_size, local_rank = launch_environment()
    except SailorError as e:
        print(f"sailor: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    started = start(args, rank, world_size, local_rank)
    if isinstance(started, int):
        return started
    plan, model, layout, data, store = started
    try:
        return train(args, plan, model, layout, rank, local_rank, data, store)
    except SailorError as e:
        if rank == 0 or not getattr(e, "agreed", False):  # an agreed error names its rank; rank 0 says it
            print(f"sailor: error: {e}" if getattr(e, "agreed", False) else f"sailor: error: rank {rank}: {e}",
                  file=sys.stderr, flush=True)
        if getattr(e, "agreed", False):
            # Every rank leaves at once, before training wrote anything. Left to the interpreter's exit, the
            # process group's destructor can find a peer already gone and abort the process (SIGABRT).
            sys.stdout.flush()
            os._exit(e.exit_code)
        return e.exit_code
    except RuntimeError as e:
        if not _is_peer_failure(e):
            raise
        slot = layout.slots[rank]
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"sailor: error: rank {rank} (stage {slot.stage}, replica {slot.replica}, TP rank {slot.tp_rank}): "
              f"a collective failed because a peer died or did not answer within --dist-timeout "
              f"{args.dist_timeout:g} s ({first[:300]}); check the other ranks' logs and restart from the last "
              f"checkpoint with --load", file=sys.stderr, flush=True)
        # The process group may be wedged; leave without running its destructors.
        os._exit(PEER_FAILURE_EXIT)


if __name__ == "__main__":
    sys.exit(main())
