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
    import torch

    from sailor_ext import checkpoint

    steps = [m["step_time_s"] for m in metrics]
    blocked = [m["save_blocked_s"] for m in metrics if "save_blocked_s" in m]
    directory = checkpoint.choose(ckpt).directory
    writes = []
    for rank_file in sorted(directory.glob("rank*.pt")):
        pieces = [checkpoint.Piece(p["name"], p["dim"], p["start"], p["stop"],
                                   {k: v.clone() for k, v in p.items() if isinstance(v, torch.Tensor)})
                  for p in torch.load(rank_file, weights_only=True)]
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            checkpoint.write_pieces(Path(tmp), 0, pieces)
            writes.append(time.perf_counter() - t)
    step, block = statistics.median(steps), statistics.median(blocked)
    return {"step_s_median": step, "save_blocked_s_median": block, "save_blocked_s_max": max(blocked),
            "blocked_fraction_of_step": block / step, "checkpoints": len(blocked),
            "sync_write_s_slowest_rank": max(writes), "sync_write_fraction_of_step": max(writes) / step,
            "bytes_per_checkpoint": sum(f.stat().st_size for f in directory.glob("rank*.pt"))}


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
    args = ap.parse_args()
    kills, joins, freezes, hangs, outages, saves = [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="sailor-reconfigure-") as tmp:
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
                     "cpu_cores": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}}
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
