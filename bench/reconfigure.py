"""How fast an elastic job reconfigures, and what a checkpoint costs a step. Prints JSON.

    python bench/reconfigure.py [--trials 5] [--freeze-trials 3] [--hang-trials 3] [--controller-trials 3]
                                [--outage-s 5] [--out FILE]

Each trial starts `sailor run` with three local node agents of 2 CPU "GPUs"
(tiny model, global batch 12, a checkpoint every 4 steps), then:

  * kill: SIGKILL one node's agent (its workers die with it) two steps after
    a checkpoint; time from the kill to the first completed step on the new
    plan, split into
        detection   kill -> the controller declares the node lost
        replan      -> the new plan is published (planner + settle)
        fallback    -> (only if a survivor's worker was wedged in gloo and
                       restarted) the plan without its node is published
        restart     -> the survivors left the old epoch, formed the new
                       process groups and built the new stage models
        load        -> state restored (from the survivors' memory)
        first_step  -> the first step on the new plan completed;
  * join: then start a fourth agent; time from its start to its workers
    being ready (they import torch meanwhile, training goes on), and the
    stall of training: from the last step on the old plan to the first step
    on the new one, split as above;
  * freeze (separate trials): SIGSTOP a node's agent and workers (a hung VM:
    no connection drops), so detection is by missed heartbeats (0.25 s x 4);
  * hang (separate trials): SIGSTOP one worker while its agent lives: found
    by the worker's own heartbeat (controller defaults, 0.5 s x 4), split as
    for a kill (detection: -> the controller reports the worker hung);
  * controller (separate trials, 1 node of 2 workers): SIGKILL `sailor run`,
    start it again --outage-s later with the same journal: the steps the
    workers trained meanwhile, how long the new controller took from its
    start to re-adopting the job, and the longest pause between two steps
    of the whole run against the median step.

Also: the median step time and how long a checkpoint (snapshot into host
memory, bytes written in the background) blocks its step, against writing
the same bytes synchronously.

And resume (--resume-gb, default 1): a logical state of that many GB (fp32
weights and both AdamW moments of 16 tensors) saved by 4 ranks, resumed by
8 ranks (each needs an eighth of every tensor), side by side in the format before this
change (checkpoint.py of commit BEFORE, read from git: rank 0 re-hashes every
file, then each rank memory-maps its slices) and now (rank 0 checks
meta.json and `latest`, each rank hashes the tensors it reads). The ranks
load one after another here (2 shared cores); resume_s is the critical path
of parallel ranks: rank 0's check plus the slowest rank's load (median of 3
interleaved trials).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "elastic"))

from _elastic_helpers import Job  # noqa: E402

INTERVAL = 4
PHASES = ("detection", "replan", "fallback", "restart", "load", "first_step")


def train_args(iters: int) -> list[str]:
    return ["--train-iters", str(iters), "--save", "ckpt", "--save-interval", str(INTERVAL), "--dist-timeout", "30"]


def _event(job: Job, kind: str, **match) -> dict | None:
    return next((e for e in job.events(kind) if all(e.get(k) == v for k, v in match.items())), None)


def _recovery_phases(job: Job, t_fault: float, after_epoch: int, found: str = "node_lost") -> dict:
    lost = job.wait_for(lambda: job.events(found), 30, "the fault to be found")[-1]
    start = job.wait_for(lambda: [e for e in job.events("epoch_started") if e["epoch"] > after_epoch], 60,
                         "the recovery epoch")[0]
    first_plan = _event(job, "epoch_published", epoch=after_epoch + 1)
    published = _event(job, "epoch_published", epoch=start["epoch"])
    restart = start["t_start"] + start["pg_s"] + start["build_s"] - published["t"]
    return {"detection": lost["t_detect"] - t_fault, "replan": first_plan["t"] - lost["t_detect"],
            # a survivor's worker wedged in gloo: the plan that included it is abandoned after the
            # worker's grace period and the next one goes without its node (0 when none did)
            "fallback": published["t"] - first_plan["t"],
            "restart": restart, "load": start["load_s"], "first_step": start["first_step_s"],
            "total": start["t_first_step"] - t_fault, "cause": lost.get("cause", found), "epoch": start["epoch"],
            "source": start["source"], "fallback_restart": bool(job.events("worker_lost"))}


def kill_and_join(workdir: Path) -> tuple[dict, dict, list[dict]]:
    job = Job(workdir, train_args(10_000), controller_args=["--reconfigure-cost-s", "0"])
    try:
        for name in "abc":
            job.add_agent(name)
        job.wait_epoch_started(1, timeout=180)
        victim = _event(job, "epoch_published", epoch=1)["nodes"][1]
        job.wait_step(INTERVAL + 2)
        t_kill = job.kill_agent(victim)
        kill = _recovery_phases(job, t_kill, 1)
        job.wait_step(max(m["step"] for m in job.metrics()) + 3, epoch=kill["epoch"])
        epochs_before = max(e["epoch"] for e in job.events("epoch_started"))
        t_join = time.time()
        job.add_agent("d")
        ready = job.wait_for(lambda: _event(job, "node_ready", node="d"), 180, "the new node's workers")
        start = job.wait_for(lambda: [e for e in job.events("epoch_started") if e["epoch"] > epochs_before], 60,
                             "the scaled epoch")[0]
        published = _event(job, "epoch_published", epoch=start["epoch"])
        stop = [e for e in job.events("epoch_stop") if e["epoch"] == start["epoch"] - 1][-1]
        # the old plan's last step (rank 0 of the new plan may be a fresh process without one)
        last_old = max(m["time"] for m in job.metrics() if m["epoch"] < start["epoch"])
        join = {"workers_ready": ready["t"] - t_join, "decide": stop["t"] - ready["t"],
                "drain": last_old - stop["t"],
                "restart": start["t_start"] + start["pg_s"] + start["build_s"] - max(published["t"], last_old),
                "load": start["load_s"], "first_step": start["first_step_s"],
                "stall": start["t_first_step"] - last_old, "world": published["world"],
                "source": start["source"]}
        job.wait_step(start["step"] + 3, epoch=start["epoch"])
        job.controller.send_signal(signal.SIGTERM)
        job.wait(60)
        return kill, join, job.metrics()
    finally:
        job.close()


def freeze(workdir: Path) -> dict:
    job = Job(workdir, train_args(10_000), controller_args=["--heartbeat-s", "0.25", "--heartbeat-misses", "4"])
    frozen: list[int] = []
    try:
        for name in "abc":
            job.add_agent(name)
        job.wait_epoch_started(1, timeout=180)
        victim = _event(job, "epoch_published", epoch=1)["nodes"][1]
        frozen = [job.agents[victim].pid, *job.worker_pids(victim)]
        job.wait_step(INTERVAL + 2)
        t_freeze = time.time()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        phases = _recovery_phases(job, t_freeze, 1)
        job.wait_step(max(m["step"] for m in job.metrics()) + 2, epoch=phases["epoch"])
        job.controller.send_signal(signal.SIGTERM)
        job.wait(60)
        return phases
    finally:
        job.close(frozen)


def hang(workdir: Path) -> dict:
    job = Job(workdir, train_args(10_000))
    frozen = 0
    try:
        for name in "abc":
            job.add_agent(name)
        job.wait_epoch_started(1, timeout=180)
        victim = _event(job, "epoch_published", epoch=1)["nodes"][1]
        frozen = job.worker_pids(victim)[1]
        job.wait_step(INTERVAL + 2)
        t_stop = time.time()
        os.kill(frozen, signal.SIGSTOP)
        phases = _recovery_phases(job, t_stop, 1, found="worker_hung")
        job.wait_step(max(m["step"] for m in job.metrics()) + 2, epoch=phases["epoch"])
        job.controller.send_signal(signal.SIGTERM)
        job.wait(60)
        return phases
    finally:
        job.close([frozen] if frozen else [])


def controller_outage(workdir: Path, outage_s: float) -> dict:
    job = Job(workdir, train_args(10_000), global_batch=12, min_gpus=2)
    try:
        job.add_agent("a")
        job.wait_step(INTERVAL + 2)
        job.controller.kill()
        job.controller.wait()
        t_kill = time.time()
        time.sleep(outage_s)
        t_restart = time.time()
        job.start_controller()
        adopted = job.wait_for(lambda: job.events("controller_adopted"), 30, "the new controller to take over")[0]
        job.wait_step(max(m["step"] for m in job.metrics()) + 5)
        job.controller.send_signal(signal.SIGTERM)
        job.wait(60)
        metrics = job.metrics()
        times = [m["time"] for m in metrics]
        gaps = [b - a for a, b in zip(times, times[1:])]
        return {"outage_s": outage_s, "steps_during_outage": sum(t_kill < t < t_restart for t in times),
                "takeover_s": adopted["t"] - t_restart, "max_step_gap_s": max(gaps),
                "median_step_gap_s": statistics.median(gaps),
                "epochs": sorted({m["epoch"] for m in metrics}),
                "steps_contiguous": [m["step"] for m in metrics] == list(range(1, len(metrics) + 1))}
    finally:
        job.close()


def save_cost(metrics: list[dict], ckpt: Path) -> dict:
    """Blocking time of checkpoints vs the step, and the synchronous write they avoid."""
    from sailor_ext import checkpoint
    from sailor_ext.storage import Storage

    steps = [m["step_time_s"] for m in metrics]
    blocked = [m["save_blocked_s"] for m in metrics if "save_blocked_s" in m]
    choice = checkpoint.choose(str(ckpt))
    ckpt_files = checkpoint.open_choice(choice).meta["files"]
    writes = []
    for name in ckpt_files:
        whole = checkpoint.open_choice(choice)
        pieces = [checkpoint.Piece(p["name"], p["dim"], p["start"], p["stop"],
                                   {k: whole.tensor({**p, "file": name}, k).clone() for k in p["tensors"]})
                  for p in ckpt_files[name]["pieces"]]
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            checkpoint.write_pieces(Storage(tmp), 0, 0, pieces)
            writes.append(time.perf_counter() - t)
    step, block = statistics.median(steps), statistics.median(blocked)
    return {"step_s_median": step, "save_blocked_s_median": block, "save_blocked_s_max": max(blocked),
            "blocked_fraction_of_step": block / step, "checkpoints": len(blocked),
            "sync_write_s_slowest_rank": max(writes), "sync_write_fraction_of_step": max(writes) / step,
            "bytes_per_checkpoint": sum(f["bytes"] for f in ckpt_files.values())}


BEFORE = "7e9487a"  # the last commit with the v2 format (torch.save files, whole-file SHA-256 on rank 0)


def _old_checkpoint_module():
    """checkpoint.py as it was at BEFORE, loaded from git under another name."""
    import importlib.util
    import subprocess

    source = subprocess.run(["git", "show", f"{BEFORE}:sailor_ext/checkpoint.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("sailor_checkpoint_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, "sailor_checkpoint_before.py", "exec"), module.__dict__)
    return module


def resume_cost(workdir: Path, gigabytes: float, saved_by: int = 4, loaded_by: int = 8, trials: int = 3) -> dict:
    """Resume of a `gigabytes` state, before vs now (see the module's docstring)."""
    import torch

    from sailor_ext import checkpoint
    from sailor_ext.storage import Storage

    old = _old_checkpoint_module()
    keys = ("param", "exp_avg", "exp_avg_sq")
    tensors, cols = 16, 1024
    rows = int(gigabytes * 2**30 / (tensors * len(keys) * cols * 4)) // (saved_by * loaded_by) * saved_by * loaded_by
    meta = {"consumed_samples": 0, "optimizer_steps": 1, "optimizer_state": list(keys[1:])}
    gen = torch.Generator().manual_seed(0)
    files_old, files_new = [], []
    for r in range(saved_by):  # each saving rank owns a quarter of the rows of every tensor
        lo, hi = r * rows // saved_by, (r + 1) * rows // saved_by
        parts = [(f"t{t}", {k: torch.randn(hi - lo, cols, generator=gen) for k in keys}) for t in range(tensors)]
        files_old.append(old.write_pieces(old.staging_dir(workdir / "before", 1, 0), r,
                                          [old.Piece(name, 0, lo, hi, ts) for name, ts in parts]))
        files_new.append(checkpoint.write_pieces(Storage(workdir / "now"), 1, r,
                                                 [checkpoint.Piece(name, 0, lo, hi, ts) for name, ts in parts]))
        del parts
    old.commit(workdir / "before", 1, 0, files_old, meta)
    checkpoint.commit(Storage(workdir / "now"), 1, files_new, meta)
    state_bytes = tensors * len(keys) * rows * cols * 4

    def hashed(rank: int) -> int:
        """Bytes this rank reads and hashes: the hash blocks (checkpoint.BLOCK_BYTES of rows) holding its rows."""
        lo, hi = rank * rows // loaded_by, (rank + 1) * rows // loaded_by
        index = checkpoint.open_choice(checkpoint.choose(str(workdir / "now"))).meta["files"].values()
        total = 0
        for piece in (p for f in index for p in f["pieces"]):
            a, b = max(lo, piece["start"]) - piece["start"], min(hi, piece["stop"]) - piece["start"]
            for rec in piece["tensors"].values() if a < b else ():
                per = rec["block_rows"]
                read = min(-(-b // per) * per, piece["stop"] - piece["start"]) - a // per * per
                total += read * cols * 4
        return total

    def load(ckpt, rank: int) -> float:
        lo, hi = rank * rows // loaded_by, (rank + 1) * rows // loaded_by
        t = time.perf_counter()
        for i in range(tensors):
            for k in keys:
                ckpt.assemble(f"t{i}", k, 0, lo, hi, (hi - lo, cols))
        return time.perf_counter() - t

    def before() -> tuple[float, list[float]]:
        t = time.perf_counter()
        directory = old.choose(workdir / "before").directory  # rank 0 re-hashes every file
        check = time.perf_counter() - t
        return check, [load(old.open_directory(directory), r) for r in range(loaded_by)]

    def now() -> tuple[float, list[float]]:
        t = time.perf_counter()
        choice = checkpoint.choose(str(workdir / "now"))  # rank 0: meta.json and `latest`
        check = time.perf_counter() - t
        return check, [load(checkpoint.open_choice(choice), r) for r in range(loaded_by)]

    runs = {"before": [], "now": []}
    for _ in range(trials):  # interleaved: both see the same machine load
        runs["before"].append(before())
        runs["now"].append(now())

    def summary(name: str) -> dict:
        checks = [c for c, _ in runs[name]]
        critical = [c + max(loads) for c, loads in runs[name]]
        i = critical.index(statistics.median(critical)) if trials % 2 else 0
        return {"rank0_check_s_median": round(statistics.median(checks), 4),
                "load_s_per_rank": [round(x, 3) for x in runs[name][i][1]],
                "resume_s_median": round(statistics.median(critical), 3),
                "resume_s_trials": [round(x, 3) for x in critical]}

    meta_bytes = len(Storage(workdir / "now").get("iter_0000001/meta.json"))
    return {"state_gb": round(state_bytes / 2**30, 3), "saved_by_ranks": saved_by, "loaded_by_ranks": loaded_by,
            "trials": trials, "before": {**summary("before"), "rank0_bytes_hashed": state_bytes},
            "now": {**summary("now"), "rank0_bytes_hashed": meta_bytes,
                    "bytes_hashed_per_rank": [hashed(r) for r in range(loaded_by)]}}


def summarize(trials: list[dict], keys) -> dict:
    return {k: round(statistics.median(t[k] for t in trials), 4) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5, help="kill + join trials (default 5)")
    ap.add_argument("--freeze-trials", type=int, default=3)
    ap.add_argument("--hang-trials", type=int, default=3)
    ap.add_argument("--controller-trials", type=int, default=3)
    ap.add_argument("--outage-s", type=float, default=5.0, help="how long the controller stays dead (default 5)")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--resume-gb", type=float, default=1.0, help="state size of the resume comparison (0: skip)")
    args = ap.parse_args()
    kills, joins, freezes, hangs, outages, saves = [], [], [], [], [], []
    resume = None
    with tempfile.TemporaryDirectory(prefix="sailor-reconfigure-") as tmp:
        if args.resume_gb > 0:
            resume = resume_cost(Path(tmp) / "resume", args.resume_gb)
            print(f"resume of {resume['state_gb']} GB: {resume['before']['resume_s_median']} s before, "
                  f"{resume['now']['resume_s_median']} s now", file=sys.stderr, flush=True)
        for i in range(args.trials):
            kill, join, metrics = kill_and_join(Path(tmp) / f"kill{i}")
            kills.append(kill)
            joins.append(join)
            saves.append(save_cost(metrics, Path(tmp) / f"kill{i}" / "ckpt"))
            print(f"trial {i}: kill -> first step {kill['total']:.2f} s, join stall {join['stall']:.2f} s",
                  file=sys.stderr, flush=True)
        for i in range(args.freeze_trials):
            freezes.append(freeze(Path(tmp) / f"freeze{i}"))
            print(f"freeze {i}: -> first step {freezes[-1]['total']:.2f} s", file=sys.stderr, flush=True)
        for i in range(args.hang_trials):
            hangs.append(hang(Path(tmp) / f"hang{i}"))
            print(f"hang {i}: -> first step {hangs[-1]['total']:.2f} s", file=sys.stderr, flush=True)
        for i in range(args.controller_trials):
            outages.append(controller_outage(Path(tmp) / f"controller{i}", args.outage_s))
            print(f"controller {i}: {outages[-1]['steps_during_outage']} steps during the outage, longest pause "
                  f"{outages[-1]['max_step_gap_s']:.2f} s", file=sys.stderr, flush=True)
    out = {"setup": {"model": "tiny", "nodes": "3 agents x 2 CPU workers (+1 joining)", "global_batch": 12,
                     "cpu_cores": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}, "resume": resume}
    if kills:
        kill_median = summarize(kills, (*PHASES, "total"))
        in_place = [k for k in kills if not k["fallback_restart"]]
        out["node_kill"] = {"median_s": kill_median, "dominant_phase": max(PHASES, key=lambda p: kill_median[p]),
                            "median_s_in_place_only": summarize(in_place, (*PHASES, "total")) if in_place else None,
                            "max_total_s": round(max(k["total"] for k in kills), 4),
                            "fallback_restarts": sum(k["fallback_restart"] for k in kills), "trials": kills}
        out["node_join"] = {"median_s": summarize(joins, ("workers_ready", "decide", "drain", "restart", "load",
                                                          "first_step", "stall")), "trials": joins}
        out["checkpoint"] = {k: round(statistics.median(s[k] for s in saves), 6) for k in saves[0]}
    if freezes:
        fm = summarize(freezes, (*PHASES, "total"))
        out["node_freeze"] = {"median_s": fm, "dominant_phase": max(PHASES, key=lambda p: fm[p]),
                              "trials": freezes}
    if hangs:
        hm = summarize(hangs, (*PHASES, "total"))
        out["worker_hang"] = {"median_s": hm, "max_total_s": round(max(h["total"] for h in hangs), 4),
                              "trials": hangs}
    if outages:
        out["controller_kill"] = {"median_s": summarize(outages, ("takeover_s", "max_step_gap_s",
                                                                  "median_step_gap_s", "steps_during_outage")),
                                  "trials": outages}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
