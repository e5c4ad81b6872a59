"""Runtime overhead vs plain DDP, and step times of heterogeneous plans (prints JSON).

1. Homogeneous data parallelism (1 stage, D replicas, TP 1): in the same D
   processes, steps of our runtime with the gradient all-reduce overlapped
   with the backward pass, the same runtime without overlap (the same
   Trainer, its GradSync.overlap switched off for that step), and torch
   DistributedDataParallel on the same model (the same megatron-built stage,
   the same initial weights) take turns on the same microbatches (who goes
   first rotates), so all three see the same conditions. A fourth contender
   is our runtime with --use-distributed-optimizer (a second Trainer in the
   same processes): its step time, and the bytes of optimizer state each
   rank holds, counted from the tensors the optimizers allocated.
   DDP runs the textbook loop: no_sync for all but the last microbatch, loss
   summed over tokens / global tokens, clip_grad_norm_, AdamW(foreach); it
   overlaps its bucketed all-reduce with the backward pass (25 MB buckets,
   the first 1 MB). We report medians after warm-up, ours / DDP and
   without / with overlap, also as medians of the step-by-step ratios.
2. Heterogeneous plans on the same model: median step time from the metrics
   file of a normal training run, next to the simulator's prediction for
   the plan from a profile measured here: `sailor profile model` on the
   same model with as many busy processes as the plan has ranks, and
   `sailor profile network --local 2` for the loopback links.

    python bench/runtime_overhead.py [--steps 20] [--replicas 2] [--grad-bucket-numel N] [--quick]

CPU only here (gloo, fp32, one thread per process).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The benchmark model: OPT-shaped, big enough that compute dominates on a CPU.
MODEL = {"model_type": "opt", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
         "ffn_dim": 1024, "vocab_size": 1024, "max_position_embeddings": 128, "_name_or_path": "bench-opt-4x256"}
TRAIN_ARGS = ["--optimizer", "adam", "--lr", "1e-4", "--clip-grad", "1.0", "--seed", "3", "--dist-timeout", "120"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, argv: list[str], cwd: Path, log_prefix: str) -> list[int]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
        log = open(cwd / f"{log_prefix}.rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        bad = next(i for i, c in enumerate(codes) if c)
        raise SystemExit(f"bench run {log_prefix} failed on rank {bad}:\n"
                         f"{(cwd / f'{log_prefix}.rank{bad}.log').read_text()[-3000:]}")
    return codes


def _plan(stages, pipelines) -> dict:
    return {"format": "sailor-plan", "version": 1, "model": "bench", "global_batch_size": sum(m * n for m, n in pipelines),
            "stages": [{"layers": list(layers), "replicas": [{"gpu": "CPU", "tp": t, "zone": "local"} for t in tps]}
                       for layers, tps in stages],
            "pipelines": [{"microbatch_size": m, "num_microbatches": n} for m, n in pipelines]}


# -- worker: ours and DDP side by side -------------------------------------------------
def worker(config: str, plan_path: str, steps: int, warmup: int, out: str, bucket_numel: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from sailor_ext.model import StageModel, init_from_seed
    from sailor_ext.train import parse_args, resolve_plan
    from sailor_ext.trainer import Trainer, init_distributed

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    argv = ["--plan", plan_path, "--model", config, "--train-iters", str(steps), *TRAIN_ARGS,
            "--grad-bucket-numel", bucket_numel, "--overlap-grad-reduce"]
    args = parse_args(argv)
    plan, model_spec, layout = resolve_plan(args, world)
    device = init_distributed(layout, rank, 0, args.dist_timeout)
    ours = Trainer(args, plan, model_spec, layout, rank, device)
    assert plan.pp == 1 and ours.topology.tp == 1, "the DDP comparison needs a pure data-parallel plan"
    sharded = Trainer(parse_args([*argv, "--use-distributed-optimizer"]), plan, model_spec, layout, rank, device)

    baseline = StageModel(ours.spec, ours.topology.tp_group, device)
    init_from_seed(baseline, args.seed)
    ddp = DistributedDataParallel(baseline)
    decay = [p for p in baseline.parameters() if p.dim() > 1]
    no_decay = [p for p in baseline.parameters() if p.dim() <= 1]
    adam = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=args.lr,
                             betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps, foreach=True)
    global_tokens = plan.global_batch_size * model_spec.seq_len

    def ddp_step(batches) -> float:
        t0 = time.perf_counter()
        for i, tokens in enumerate(batches):
            with ddp.no_sync() if i < len(batches) - 1 else nullcontext():
                logits = ddp(tokens[:, :-1])
                labels = tokens[:, 1:].t().reshape(-1)
                loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels, reduction="sum")
                (loss / global_tokens).backward()
        torch.nn.utils.clip_grad_norm_(baseline.parameters(), args.clip_grad)
        adam.step()
        adam.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def ours_step(overlap: bool):
        def step(_batches) -> float:
            ours.grad_sync.overlap = overlap
            return ours.train_step().seconds
        return step

    contenders = {"ours": ours_step(True), "ours_no_overlap": ours_step(False), "ddp": ddp_step,
                  "ours_distributed_optimizer": lambda _batches: sharded.train_step().seconds}
    names = list(contenders)
    times = {name: [] for name in names}
    early = []
    for i in range(warmup + steps):
        batches = ours.microbatches()  # the same samples for all
        for k in range(len(names)):  # rotate who goes first, so none gets a systematically warmer cache
            name = names[(i + k) % len(names)]
            seconds = contenders[name](batches)
            if name == "ours":
                early.append(ours.grad_sync.started_in_backward)
            if i >= warmup:
                times[name].append(seconds)

    def state_bytes(trainer) -> int:
        return sum(t.numel() * t.element_size() for state in trainer.optimizer.inner.state.values()
                   for key, t in state.items() if key != "step")

    if rank == 0:
        Path(out).write_text(json.dumps({**times, "buckets": ours.grad_sync.num_collectives,
                                         "started_in_backward": max(early), "state_bytes": state_bytes(ours),
                                         "state_bytes_distributed": state_bytes(sharded)}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# -- orchestration --------------------------------------------------------------------
def homogeneous(work: Path, config: Path, replicas: int, steps: int, warmup: int, bucket_numel: int) -> dict:
    plan = _plan([((0, 5), [1] * replicas)], [(4, 2)] * replicas)
    (work / "dp.json").write_text(json.dumps(plan))
    out = work / "dp_times.json"
    _spawn(replicas, [str(Path(__file__).resolve()), "--worker", str(config), "dp.json", str(steps), str(warmup),
                      str(out), str(bucket_numel)], work, "dp")
    t = json.loads(out.read_text())
    med = {k: statistics.median(t[k]) for k in ("ours", "ours_no_overlap", "ddp", "ours_distributed_optimizer")}

    def pairwise(a: str, b: str) -> float:
        return round(statistics.median(x / y for x, y in zip(t[a], t[b])), 4)

    return {"plan": f"1 stage x {replicas} replicas, TP 1, 2 microbatches of 4 each", "steps": steps,
            "grad_bucket_numel": bucket_numel, "gradient_buckets": t["buckets"],
            "buckets_started_during_backward": t["started_in_backward"],
            "ours_median_s": round(med["ours"], 4), "ours_no_overlap_median_s": round(med["ours_no_overlap"], 4),
            "ddp_median_s": round(med["ddp"], 4), "ratio": round(med["ours"] / med["ddp"], 4),
            "ratio_stepwise_median": pairwise("ours", "ddp"), "within_10_percent": med["ours"] <= 1.10 * med["ddp"],
            "no_overlap_over_overlap": round(med["ours_no_overlap"] / med["ours"], 4),
            "no_overlap_over_overlap_stepwise_median": pairwise("ours_no_overlap", "ours"),
            "distributed_optimizer": {
                "median_s": round(med["ours_distributed_optimizer"], 4),
                "over_ours_stepwise_median": pairwise("ours_distributed_optimizer", "ours"),
                "optimizer_state_bytes_rank0": t["state_bytes_distributed"],
                "without_it_bytes_rank0": t["state_bytes"],
                "state_ratio": round(t["state_bytes_distributed"] / t["state_bytes"], 4)}}


def measure_profiles(work: Path, config: Path, worlds: set[int]) -> dict[int, Path]:
    """A profiles directory per number of busy processes (the ranks share the cores)."""
    def sailor(*argv: str) -> None:
        out = subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        if out.returncode:
            raise SystemExit(f"sailor {' '.join(argv)} failed: {out.stderr.strip()[-2000:]}")

    network = work / "network.json"
    sailor("profile", "network", "--local", "2", "-o", str(network))
    dirs = {}
    for n in sorted(worlds):
        dirs[n] = work / f"profiles-{n}"
        sailor("profile", "model", "--model", str(config), "--device", "cpu", "--tp", "1,2",
               "--micro-batch-sizes", "1,2,4", "--concurrency", str(n), "-o", str(dirs[n]), "--quiet")
        (dirs[n] / "network.json").write_text(network.read_text())
    return dirs


def heterogeneous(work: Path, config: Path, name: str, plan: dict, steps: int, warmup: int, profiles: Path,
                  bucket_numel: int) -> dict:
    from planner.profiles.store import load_profiles
    from planner.simulator.simulate import Simulator
    from planner.specs.hardware import load_cluster
    from planner.specs.model import get_model
    from planner.specs.plan import plan_from_dict

    (work / f"{name}.json").write_text(json.dumps(plan))
    world = sum(r["tp"] for s in plan["stages"] for r in s["replicas"])
    measured = {}
    for overlap in ("--overlap-grad-reduce", "--no-overlap-grad-reduce"):  # one run each, one after the other
        metrics = work / f"{name}{overlap}.jsonl"
        _spawn(world, ["-m", "sailor_ext.train", "--plan", f"{name}.json", "--model", str(config), "--train-iters",
                       str(warmup + steps), "--metrics-file", str(metrics), *TRAIN_ARGS, overlap,
                       "--grad-bucket-numel", str(bucket_numel)], work, name)
        times = [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()][warmup:]
        measured[overlap] = statistics.median(times)
    model = get_model(str(config))
    parsed = plan_from_dict({**plan, "model": str(config)})
    cluster = load_cluster(None)
    store = load_profiles([str(profiles)], dict(cluster.gpus), model)
    predicted = Simulator(model, cluster, store, "fp32").simulate(parsed).iteration_time_s
    with_overlap = measured["--overlap-grad-reduce"]
    return {"plan": name, "ranks": world, "measured_median_s": round(with_overlap, 4),
            "no_overlap_median_s": round(measured["--no-overlap-grad-reduce"], 4),
            "simulator_predicted_s": round(predicted, 4), "error_pct": round(100 * (predicted / with_overlap - 1), 1),
            "simulator_profile": f"measured here with {world} busy processes"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="timed steps (default 20, with --quick 5)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--grad-bucket-numel", type=int, default=2**22, help="our gradient bucket size (elements)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and no heterogeneous plans")
    ap.add_argument("--worker", nargs=6, metavar=("CONFIG", "PLAN", "STEPS", "WARMUP", "OUT", "BUCKET"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        config, plan, steps, warmup, out, bucket_numel = args.worker
        worker(config, plan, int(steps), int(warmup), out, bucket_numel)
        return 0
    steps = args.steps or (5 if args.quick else 20)
    with tempfile.TemporaryDirectory(prefix="sailor-bench-") as tmp:
        work = Path(tmp)
        config = work / "config.json"
        config.write_text(json.dumps(MODEL))
        result = {"model": MODEL["_name_or_path"], "device": "cpu", "threads_per_process": 1,
                  "homogeneous_dp": homogeneous(work, config, args.replicas, steps, args.warmup,
                                                args.grad_bucket_numel)}
        if not args.quick:
            plans = {
                "2 stages (TP 2, TP 1) x 2 replicas, mbs 2 and 1": _plan([((0, 2), [2, 2]), ((3, 5), [1, 1])],
                                                                         [(2, 4), (1, 8)]),
                "1 stage, replicas TP 2 and TP 1, mbs 4 and 2": _plan([((0, 5), [2, 1])], [(4, 2), (2, 4)]),
            }
            worlds = {sum(r["tp"] for s in p["stages"] for r in s["replicas"]) for p in plans.values()}
            profiles = measure_profiles(work, config, worlds)
            result["heterogeneous"] = []
            for i, (name, p) in enumerate(plans.items()):
                world = sum(r["tp"] for s in p["stages"] for r in s["replicas"])
                result["heterogeneous"].append(heterogeneous(work, config, f"het{i}", p, steps, args.warmup,
                                                             profiles[world], args.grad_bucket_numel) | {"plan": name})
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
