"""One process of a model-profiling run: `python -m sailor_ext.profile.worker CONFIG.json`.

Started like torchrun starts ranks (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), by `sailor profile model` or by torchrun itself. Ranks 0..tp-1
form the TP group whose layers are measured. On CPU, ranks tp..world-1 are
*load* ranks: a plan that puts N training processes on one machine makes
them share its cores (and caches and memory bandwidth), so a profile meant
for such a plan is measured with N processes busy at once. A load rank runs
the same layers' forward and backward passes, at the same microbatch size,
until rank 0 has finished measuring and drops a stop file into `stop_dir`
(load ranks share the machine by definition; gloo's irecv cannot be polled).

Rank 0 writes one JSON line per result on stdout:
    {"kind": "optimizer", "tp": t, "seconds": s, "params": n}
    {"kind": "point", "mbs": b, "tp": t, "fwd": [...], "bwd": [...], ...}   (PointMeasurement)
    {"kind": "oom", "mbs": b, "tp": t}                                       (CUDA out of memory)
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class WorkerConfig:
    model: str  # preset name or config.json path
    tp: int
    mbs: list[int]  # microbatch sizes still to measure, ascending
    optimizer: bool = True  # also time the optimizer step
    load_mbs: int = 1  # microbatch size the load ranks run while the optimizer is timed
    warmup: int = 3
    repeats: int = 20
    blocks: int = 2
    threads: int = 1  # CPU threads per process (torch.set_num_threads)
    precision: str = "fp32"
    statistic: str = "median"  # median | mean over the repetitions (timing.py says when each)
    seed: int = 1234
    timeout_s: float = 600.0
    stop_dir: str = ""  # where rank 0 signals the load ranks; default: a folder named after MASTER_PORT

    @staticmethod
    def load(path: str) -> "WorkerConfig":
        return WorkerConfig(**json.loads(open(path).read()))


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _oom_types() -> tuple[type, ...]:
    return (torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else ()


def run(cfg: WorkerConfig) -> int:
    from planner.specs.model import get_model
    from sailor_ext.compat import pick_device
    from sailor_ext.profile.layers import LayerBench

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.set_num_threads(cfg.threads)
    device = pick_device(local_rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.timeout_s))
    tp_group = dist.new_group(list(range(cfg.tp)))
    solo = {r: dist.new_group([r]) for r in range(cfg.tp, world)}  # every rank creates every group
    measuring = rank < cfg.tp
    model = get_model(cfg.model)
    if measuring:
        bench = LayerBench(model, cfg.blocks, cfg.tp, rank, tp_group, device, cfg.precision, cfg.seed)
    else:
        bench = LayerBench(model, cfg.blocks, 1, 0, solo[rank], device, cfg.precision, cfg.seed + rank)
    stop_dir = Path(cfg.stop_dir or f"/tmp/sailor-profile-{os.environ.get('MASTER_PORT', '0')}")
    if rank == 0:
        stop_dir.mkdir(parents=True, exist_ok=True)
    tasks = iter(range(1 << 30))

    def task(measure, mbs: int):
        """Run `measure` on the TP group while the load ranks keep busy."""
        stop = stop_dir / f"stop-{next(tasks)}"
        dist.barrier()
        result = None
        if measuring:
            result = measure()
            if rank == 0 and world > cfg.tp:
                stop.touch()
        else:
            bench.busy(mbs, stop.exists)
        dist.barrier()
        if rank == 0:
            stop.unlink(missing_ok=True)
        return result

    if cfg.optimizer:
        result = task(lambda: bench.optimizer_seconds(cfg.warmup, cfg.repeats, cfg.statistic), cfg.load_mbs)
        if rank == 0:
            _emit({"kind": "optimizer", "tp": cfg.tp, "seconds": result[0], "params": result[1]})
    for mbs in cfg.mbs:
        def measure(mbs=mbs):
            try:
                return bench.measure(mbs, cfg.warmup, cfg.repeats, cfg.statistic)
            except _oom_types():
                torch.cuda.empty_cache()
                return None
        point = task(measure, mbs)
        oom = torch.tensor([0.0 if (point is not None or not measuring) else 1.0], device=device)
        dist.all_reduce(oom, op=dist.ReduceOp.MAX)  # every rank agrees to stop
        if rank == 0:
            _emit({"kind": "oom", "mbs": mbs, "tp": cfg.tp} if oom.item() else
                  {"kind": "point", "kinds": bench.kinds, **point.to_dict()})
        if oom.item():
            break  # larger microbatches will not fit either
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m sailor_ext.profile.worker CONFIG.json (started by `sailor profile model`)",
              file=sys.stderr)
        return 2
    return run(WorkerConfig.load(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
