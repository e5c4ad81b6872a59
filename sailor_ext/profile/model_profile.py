"""`sailor profile model`: measure a model's layers on this machine and write its profile.

For every TP degree t, t worker processes (sailor_ext.profile.worker, started
the way torchrun starts ranks: gloo on CPU, NCCL on GPUs) build the runtime's
layers and measure every requested microbatch size, then the optimizer step.
Each finished (microbatch size, TP) point is appended to
`DIR/MODEL/GPU/profile.partial.json` at once, so an interrupted run continues
with `--resume` where it stopped; the finished profile is
`DIR/MODEL/GPU/profile.json` (planner.profiles.profile's format).

CPU: `concurrency` N > t adds N - t load ranks running the same layers, so the
profile describes one of N training processes sharing this machine's cores
(what a plan with N local ranks sees; see docs/profiler.md).
"""
from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from planner.errors import SailorError
from planner.launch import check_tp
from planner.profiles.profile import MEASURED, LayerMemory, LayerTimes, Profile, profile_dir, save_profile
from planner.specs.model import ModelSpec, canonical_name, get_model
from sailor_ext.profile.ranks import run_local_ranks

PARTIAL_FORMAT = "sailor-profile-partial"


@dataclass(frozen=True)
class ModelProfileRequest:
    model: str
    out_dir: str
    device: str = "cpu"  # cpu | cuda
    gpu: str | None = None  # GPU type; default: detected
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    tp_degrees: tuple[int, ...] = (1,)
    warmup: int = 3
    repeats: int = 20
    blocks: int = 2  # transformer blocks built and timed; the rest repeat their median
    threads: int = 1  # CPU threads per process
    concurrency: int = 1  # CPU: processes busy at once while measuring
    precision: str | None = None  # default: bf16 on CUDA (as the runtime), fp32 on CPU
    seed: int = 1234
    resume: bool = False
    timeout_s: float = 600.0


@dataclass(frozen=True)
class Settings:
    """What must not change between an interrupted run and its --resume."""

    model: str
    gpu: str
    device: str
    precision: str
    seq_len: int
    blocks: int
    warmup: int
    repeats: int
    threads: int
    concurrency: int
    seed: int
    statistic: str  # median, or mean where busy processes outnumber the cores


STATISTIC_NOTES = {
    "median": "median over repetitions (robust to a slow one); with TP > 1 the slowest TP rank's",
    "mean": "mean over repetitions: more busy processes than cores make time-sharing the steady state, which "
            "the median would not see; with TP > 1 the slowest TP rank's",
}


class Interrupted(SailorError):
    exit_code = 130


# -- checking the request ---------------------------------------------------------------
def check_request(req: ModelProfileRequest) -> tuple[ModelSpec, Settings]:
    """Every mistake in the request, as one SailorError, before any process starts."""
    from sailor_ext.profile.device import cores, resolve_gpu

    model = get_model(req.model)
    if req.device not in ("cpu", "cuda"):
        raise SailorError(f"unknown --device {req.device!r}: use cpu or cuda")
    if not req.microbatch_sizes or min(req.microbatch_sizes) < 1:
        raise SailorError(f"--micro-batch-sizes must be positive integers, got {list(req.microbatch_sizes)}")
    if not req.tp_degrees or min(req.tp_degrees) < 1:
        raise SailorError(f"--tp must be positive integers, got {list(req.tp_degrees)}")
    for t in req.tp_degrees:
        check_tp(model, t, "--tp")
    if req.warmup < 0 or req.repeats < 1 or req.blocks < 1 or req.threads < 1 or req.concurrency < 1:
        raise SailorError("--warmup must be >= 0 and --repeats, --blocks, --threads, --concurrency >= 1")
    if req.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SailorError("--device cuda but no CUDA device is visible; use --device cpu")
        if max(req.tp_degrees) > torch.cuda.device_count():
            raise SailorError(f"--tp {max(req.tp_degrees)} needs that many GPUs but this machine has "
                              f"{torch.cuda.device_count()}; profile smaller TP degrees here")
        if req.concurrency != 1:
            raise SailorError("--concurrency models processes sharing CPU cores; it is for --device cpu only")
    precision = req.precision or ("bf16" if req.device == "cuda" else "fp32")
    if precision not in ("fp32", "bf16", "fp16"):
        raise SailorError(f"unknown --precision {precision!r}: use fp32, bf16 or fp16")
    if precision != "fp32" and req.device == "cpu":
        raise SailorError("the runtime trains in fp32 on CPU; profile with --precision fp32")
    gpu = resolve_gpu(req.gpu, req.device)
    oversubscribed = req.device == "cpu" and max(req.concurrency, *req.tp_degrees) * req.threads > cores()
    settings = Settings(canonical_name(model.name), gpu, req.device, precision, model.seq_len,
                        min(req.blocks, model.num_blocks), req.warmup, req.repeats, req.threads, req.concurrency,
                        req.seed, "mean" if oversubscribed else "median")
    return model, settings


# -- the partial file (what --resume continues) --------------------------------------------
def _key(mbs: int, tp: int) -> str:
    return f"{mbs}/{tp}"


@dataclass
class Progress:
    """Points finished so far; saved after each one."""

    path: Path
    settings: Settings
    points: dict  # "mbs/tp" -> worker record
    optimizer: dict  # "tp" -> {"seconds", "params"}
    oom: list  # "mbs/tp" that ran out of memory

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"format": PARTIAL_FORMAT, "settings": asdict(self.settings),
                                   "points": self.points, "optimizer": self.optimizer, "oom": self.oom}) + "\n")
        tmp.replace(self.path)

    def record(self, msg: dict) -> None:
        if msg["kind"] == "optimizer":
            self.optimizer[str(msg["tp"])] = {"seconds": msg["seconds"], "params": msg["params"]}
        elif msg["kind"] == "oom":
            self.oom.append(_key(msg["mbs"], msg["tp"]))
        else:
            self.points[_key(msg["mbs"], msg["tp"])] = msg
        self.save()

    def todo(self, sizes, tp: int) -> list[int]:
        """Microbatch sizes at `tp` still to measure (none at or above a size that ran out of memory)."""
        failed = [int(k.split("/")[0]) for k in self.oom if int(k.split("/")[1]) == tp]
        limit = min(failed) if failed else float("inf")
        return [b for b in sorted(set(sizes)) if _key(b, tp) not in self.points and b < limit]


def open_progress(path: Path, settings: Settings, resume: bool) -> Progress:
    if not resume:
        return Progress(path, settings, {}, {}, [])
    if not path.exists():
        raise SailorError(f"nothing to resume: {path} does not exist; run without --resume")
    try:
        d = json.loads(path.read_text())
        old = Settings(**d["settings"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SailorError(f"{path} is not a profiling run's progress file ({e}); delete it and run without "
                          "--resume") from None
    if old != settings:
        diff = ", ".join(f"{k} {getattr(old, k)!r} -> {getattr(settings, k)!r}" for k in asdict(settings)
                         if getattr(old, k) != getattr(settings, k))
        raise SailorError(f"the interrupted run in {path} used other settings ({diff}); resume with the same "
                          "settings, or run without --resume to start over")
    return Progress(path, settings, d.get("points", {}), d.get("optimizer", {}), d.get("oom", []))


# -- running the workers ---------------------------------------------------------------------
def _run_workers(req: ModelProfileRequest, settings: Settings, tp: int, sizes: list[int], need_optimizer: bool,
                 on_message: Callable[[dict], None], workdir: Path) -> None:
    """One TP degree: start its ranks, pass rank 0's results on as they come."""
    world = max(tp, settings.concurrency) if settings.device == "cpu" else tp
    cfg = {"model": req.model, "tp": tp, "mbs": sizes, "optimizer": need_optimizer,
           "load_mbs": min(req.microbatch_sizes), "warmup": settings.warmup,
           "repeats": settings.repeats, "blocks": settings.blocks, "threads": settings.threads,
           "precision": settings.precision, "seed": settings.seed, "timeout_s": req.timeout_s,
           "statistic": settings.statistic,
           "stop_dir": str(workdir / f"stop-tp{tp}")}
    cfg_path = workdir / f"worker-tp{tp}.json"
    cfg_path.write_text(json.dumps(cfg))

    def on_line(line: str) -> None:
        if line.startswith("{"):
            on_message(json.loads(line))

    run_local_ranks("sailor_ext.profile.worker", cfg_path, world, on_line, workdir, req.timeout_s,
                    f"profiling at TP {tp}", lambda rank: {"OMP_NUM_THREADS": str(settings.threads)})


def profile_model(req: ModelProfileRequest, on_progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Measure, save, return the profile's path. on_progress(what, done, total) after each point."""
    model, settings = check_request(req)
    target = profile_dir(req.out_dir, settings.model, settings.gpu)
    progress = open_progress(target / "profile.partial.json", settings, req.resume)
    tps, sizes = sorted(set(req.tp_degrees)), sorted(set(req.microbatch_sizes))
    total = len(tps) * len(sizes)

    def done() -> int:  # measured, or skipped because a smaller size ran out of memory
        return total - sum(len(progress.todo(sizes, t)) for t in tps)

    if on_progress:
        on_progress("resuming" if done() else "starting", done(), total)
    progress.save()

    def on_message(msg: dict) -> None:
        progress.record(msg)
        if on_progress and msg["kind"] != "optimizer":
            what = "out of memory" if msg["kind"] == "oom" else "done"
            on_progress(f"TP {msg['tp']}, microbatch {msg['mbs']}: {what}", done(), total)

    with tempfile.TemporaryDirectory(prefix="sailor-profile-") as tmp:
        try:
            for tp in tps:
                todo, need_optimizer = progress.todo(sizes, tp), str(tp) not in progress.optimizer
                if todo or need_optimizer:
                    _run_workers(req, settings, tp, todo, need_optimizer, on_message, Path(tmp))
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted after {done()} of {total} points; the finished ones are in "
                              f"{progress.path}: continue with --resume") from None
    profile = assemble(model, settings, progress)
    path = save_profile(profile, req.out_dir)
    progress.path.unlink(missing_ok=True)
    return path


# -- from measurements to a Profile ------------------------------------------------------------
def assemble(model: ModelSpec, settings: Settings, progress: Progress) -> Profile:
    """The profile of `model` from the finished points (blocks expanded to the whole model)."""
    from sailor_ext.profile.device import device_facts, software_versions, today
    from sailor_ext.profile.layers import expand_to_model

    if not progress.points:
        raise SailorError("no microbatch size could be measured (all ran out of memory); try smaller "
                          "--micro-batch-sizes or a larger --tp")
    times, by_tp = {}, {}
    for rec in progress.points.values():
        kinds = rec["kinds"]
        fwd = expand_to_model(rec["fwd"], kinds, model, settings.blocks)
        bwd = expand_to_model(rec["bwd"], kinds, model, settings.blocks)
        times[(rec["mbs"], rec["tp"])] = LayerTimes(tuple(fwd), tuple(bwd))
        by_tp.setdefault(rec["tp"], []).append(rec)
    memory = {}
    for tp, recs in by_tp.items():
        kinds = recs[0]["kinds"]
        params = expand_to_model(recs[0]["params"], kinds, model, settings.blocks, combine=lambda v: v[0])
        acts = [expand_to_model(r["activation_bytes"], kinds, model, settings.blocks) for r in recs]
        outs = [expand_to_model(r["output_bytes"], kinds, model, settings.blocks) for r in recs]
        memory[tp] = LayerMemory(tuple(int(p) for p in params),
                                 tuple(statistics.median(c) for c in zip(*acts)),
                                 tuple(statistics.median(c) for c in zip(*outs)))
    per_param = {int(t): o["seconds"] / o["params"] for t, o in progress.optimizer.items() if o["params"]}
    if not per_param:
        raise SailorError("the optimizer step was not measured; rerun with --resume")
    notes = {
        "seq_len": settings.seq_len, "blocks_measured": settings.blocks,
        "blocks": "every transformer block gets the median of the measured blocks of its kind of work",
        "warmup": settings.warmup, "repeats": settings.repeats,
        "statistic": STATISTIC_NOTES[settings.statistic],
        "timer": ("max(host launch, cuda events) per layer; blocks rescaled to their back-to-back time"
                  if settings.device == "cuda" else "perf_counter"),
        "activation_bytes": "storages saved for backward (saved_tensors_hooks) per sample, parameters excluded",
        "optimizer": "sailor_ext.optimizer (AdamW, global norm, clipping) over the built layers",
        "optimizer_s_per_param_by_tp": {str(t): v for t, v in sorted(per_param.items())},
        "seed": settings.seed,
    }
    peaks = {k: r["peak_bytes"] for k, r in progress.points.items() if r.get("peak_bytes")}
    if peaks:
        notes["cuda_peak_bytes_per_built_layer"] = peaks
    if progress.oom:
        notes["out_of_memory"] = sorted(progress.oom)
    meta = {"created": today(), "software": software_versions(),
            "device": device_facts(settings.device, settings.threads, settings.concurrency), "notes": notes}
    return Profile(settings.model, settings.gpu, model.num_layers, settings.precision, MEASURED, times,
                   per_param[min(per_param)], memory, meta, model)

