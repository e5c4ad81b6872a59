"""Closing the loop on CPU: profile, plan, run, and compare the simulator with the run (prints JSON).

1. Profile the tiny model on this machine with `sailor profile model --device cpu`
   (TP 1 and 2, microbatches 1-8), once per number of training processes N the
   plans use, with --concurrency N: on a machine with fewer cores than ranks the
   ranks share the cores, so the profile is measured with N processes busy.
2. Profile the local "network" (gloo over loopback) with `sailor profile network --local 2`.
3. Plan with `sailor plan --gpus CPU@local=N` on those profiles, and add
   hand-written plans covering pipeline, data and mixed TP/microbatch parallelism.
4. Run each plan with the training runtime (`sailor launch --local`, one thread per
   rank), several rounds in rotating order; the measured step time of a round is the
   median over its steps after warm-up, and a plan's is the median over rounds.
5. Predict each plan with `sailor simulate --profiles` (the profile measured with
   as many busy processes as the plan has ranks) and report the error.

    python bench/sim_vs_real_cpu.py [--rounds 3] [--steps 30] [--warmup 5] [--keep DIR] [--quick]

Nothing is fitted to the runs: the predictions use only the profiles.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
GBS = 32


def _plan(stages, pipelines) -> dict:
    """stages: [((first, last), [tp per replica])]; pipelines: [(mbs, n)]."""
    return {"format": "sailor-plan", "version": 1, "model": MODEL, "global_batch_size": sum(m * n for m, n in pipelines),
            "stages": [{"layers": list(layers), "replicas": [{"gpu": "CPU", "tp": t, "zone": "local"} for t in tps]}
                       for layers, tps in stages],
            "pipelines": [{"microbatch_size": m, "num_microbatches": n} for m, n in pipelines]}


PLANS = {
    "PP 2 stages, mbs 4 x 8": _plan([((0, 2), [1]), ((3, 5), [1])], [(4, 8)]),
    "DP 2 replicas, mbs 4 x 4 each": _plan([((0, 5), [1, 1])], [(4, 4), (4, 4)]),
    "PP 3 stages, mbs 2 x 16": _plan([((0, 1), [1]), ((2, 3), [1]), ((4, 5), [1])], [(2, 16)]),
    "mixed: stage TP 2 + stage TP 1, mbs 4 x 8": _plan([((0, 2), [2]), ((3, 5), [1])], [(4, 8)]),
    "mixed: replicas TP 2 (mbs 8 x 2) and TP 1 (mbs 4 x 4)": _plan([((0, 5), [2, 1])], [(8, 2), (4, 4)]),
    "DP 2 x PP 2, mbs 4 x 4 each": _plan([((0, 2), [1, 1]), ((3, 5), [1, 1])], [(4, 4), (4, 4)]),
}
QUICK = ("PP 2 stages, mbs 4 x 8", "DP 2 replicas, mbs 4 x 4 each")


def world_of(plan: dict) -> int:
    return sum(r["tp"] * r.get("count", 1) for s in plan["stages"] for r in s["replicas"])


def sailor(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    if check and out.returncode:
        raise SystemExit(f"sailor {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out


def load() -> float:
    return os.getloadavg()[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile(work: Path, worlds: set[int], quick: bool) -> dict[int, Path]:
    dirs = {}
    net = work / "network.json"
    t0 = time.time()
    sailor("profile", "network", "--local", "2", "-o", str(net), "--plot", str(work / "network.png"))
    for n in sorted(worlds):
        d = work / f"profiles-c{n}"
        sailor("profile", "model", "--model", MODEL, "--device", "cpu", "--micro-batch-sizes", "1,2,4,8",
               "--tp", "1,2", "--concurrency", str(n), "--repeats", "10" if quick else "30", "-o", str(d), "--quiet")
        shutil.copy(net, d / "network.json")
        dirs[n] = d
    print(f"profiled in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return dirs


def simulate(plan_path: Path, profiles: Path) -> dict:
    d = json.loads(sailor("simulate", str(plan_path), "--profiles", str(profiles), "--json").stdout)
    return {"iteration_s": d["iteration_time_s"], "pipeline_s": d["pipeline_time_s"], "sync_s": d["sync_time_s"],
            "stage_compute_s": [s["compute_s"] for s in d["stages"]]}


def run_plan(plan_path: Path, work: Path, steps: int, warmup: int) -> tuple[float, list[float]]:
    metrics = work / f"{plan_path.stem}.metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(plan_path), "--local", "--master-port",
                          str(free_port()), "--", "--train-iters", str(warmup + steps), "--metrics-file", str(metrics),
                          "--log-interval", "0"], capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode:
        raise SystemExit(f"training run of {plan_path.name} failed:\n{out.stderr[-3000:]}")
    times = [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()][warmup:]
    return statistics.median(times), times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--keep", metavar="DIR", help="keep profiles, plans and metrics here")
    ap.add_argument("--quick", action="store_true", help="two plans, one round, fewer repetitions")
    args = ap.parse_args()
    rounds, steps = (1, 10) if args.quick else (args.rounds, args.steps)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sailor-simreal-"))
    work.mkdir(parents=True, exist_ok=True)
    plans = {k: v for k, v in PLANS.items() if not args.quick or k in QUICK}
    cores = len(os.sched_getaffinity(0))

    # profiles for every process count a plan may use (the planner's pick uses at most `cores`)
    dirs = profile(work, {world_of(p) for p in plans.values()} | set(range(1, cores + 1)), args.quick)
    picked = work / "plan-planner.json"
    # the planner's own pick for a "cluster" of as many CPU processes as cores
    sailor("plan", "--model", MODEL, "--gpus", f"CPU@local={cores}", "--global-batch", str(GBS), "--profiles",
           str(dirs[cores]), "--microbatch-sizes", "1,2,4,8", "-o", str(picked), "--json")
    plans[f"planner's pick for {cores} CPU processes"] = json.loads(picked.read_text())

    paths = {}
    for i, (name, plan) in enumerate(plans.items()):
        paths[name] = work / f"plan{i}.json"
        paths[name].write_text(json.dumps(plan, indent=1))
    measured: dict[str, list[float]] = {name: [] for name in plans}
    loads: dict[str, list[float]] = {name: [] for name in plans}
    names = list(plans)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each round
            before = load()
            median, _ = run_plan(paths[name], work, steps, args.warmup)
            measured[name].append(median)
            loads[name].append(round((before + load()) / 2, 2))
            print(f"round {r + 1}: {name}: {median * 1e3:.1f} ms (load {loads[name][-1]})", file=sys.stderr,
                  flush=True)
    rows = []
    for name, plan in plans.items():
        n = world_of(plan)
        sim = simulate(paths[name], dirs[n])
        real = statistics.median(measured[name])
        rows.append({"plan": name, "ranks": n, "profile": f"--concurrency {n}",
                     "predicted_s": round(sim["iteration_s"], 5), "measured_s": round(real, 5),
                     "error_pct": round(100 * (sim["iteration_s"] - real) / real, 1),
                     "measured_per_round_s": [round(x, 5) for x in measured[name]],
                     "load_average_per_round": loads[name],
                     "predicted_detail": {k: (round(v, 5) if isinstance(v, float) else [round(x, 5) for x in v])
                                          for k, v in sim.items()},
                     "layout": {"stages": [[s["layers"], [x["tp"] for x in s["replicas"]]] for s in plan["stages"]],
                                "pipelines": [[p["microbatch_size"], p["num_microbatches"]] for p in plan["pipelines"]]}})
    errors = [abs(r["error_pct"]) for r in rows]
    print(json.dumps({"model": MODEL, "device": "cpu", "cores": cores, "threads_per_rank": 1, "rounds": rounds,
                      "steps_per_round": steps, "warmup_steps": args.warmup, "work_dir": str(work),
                      "mean_abs_error_pct": round(statistics.fmean(errors), 1), "max_abs_error_pct": max(errors),
                      "plans": rows}, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
