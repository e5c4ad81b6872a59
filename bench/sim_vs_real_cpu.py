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

Other people's processes on the machine disturb both the profiles and the runs, so every
measurement waits for a quiet machine and is repeated if others took more than 10 % of the CPU
meanwhile (/proc/stat minus our own processes); the share seen is reported per measurement.

Nothing is fitted to the runs: the predictions use only the profiles.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
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


def _plan(stages, pipelines, recompute: bool = False) -> dict:
    """stages: [((first, last), [tp per replica])]; pipelines: [(mbs, n)]; recompute: on every stage."""
    return {"format": "sailor-plan", "version": 1, "model": MODEL,
            "global_batch_size": sum(m * n for m, n in pipelines),
            "stages": [{"layers": list(layers), "replicas": [{"gpu": "CPU", "tp": t, "zone": "local"} for t in tps],
                        **({"recompute": True} if recompute else {})}
                       for layers, tps in stages],
            "pipelines": [{"microbatch_size": m, "num_microbatches": n} for m, n in pipelines]}


PLANS = {
    "PP 2 stages, mbs 4 x 8": _plan([((0, 2), [1]), ((3, 5), [1])], [(4, 8)]),
    "PP 2 stages recomputing, mbs 4 x 8": _plan([((0, 2), [1]), ((3, 5), [1])], [(4, 8)], recompute=True),
    "DP 2 replicas, mbs 4 x 4 each": _plan([((0, 5), [1, 1])], [(4, 4), (4, 4)]),
    "PP 3 stages, mbs 2 x 16": _plan([((0, 1), [1]), ((2, 3), [1]), ((4, 5), [1])], [(2, 16)]),
    "mixed: stage TP 2 + stage TP 1, mbs 4 x 8": _plan([((0, 2), [2]), ((3, 5), [1])], [(4, 8)]),
    "mixed: replicas TP 2 (mbs 8 x 2) and TP 1 (mbs 4 x 4)": _plan([((0, 5), [2, 1])], [(8, 2), (4, 4)]),
    "DP 2 x PP 2, mbs 4 x 4 each": _plan([((0, 2), [1, 1]), ((3, 5), [1, 1])], [(4, 4), (4, 4)]),
}
QUICK = ("PP 2 stages, mbs 4 x 8", "DP 2 replicas, mbs 4 x 4 each")


def describe(plan: dict) -> str:
    """'layers 0-2: TP 1 | layers 3-5: TP 1; microbatches 4x8' (one TP per replica, one share per pipeline)."""
    from planner.specs.plan import plan_from_dict

    p = plan_from_dict(plan)
    stages = " | ".join(f"layers {s.first}-{s.last}: TP {','.join(str(r.tp) for r in s.replicas)}"
                        + (" recompute" if s.recompute else "") for s in p.stages)
    return f"{stages}; microbatches {', '.join(f'{x.microbatch_size}x{x.num_microbatches}' for x in p.pipelines)}"


def world_of(plan: dict) -> int:
    return sum(r["tp"] * r.get("count", 1) for s in plan["stages"] for r in s["replicas"])


def sailor(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    if check and out.returncode:
        raise SystemExit(f"sailor {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out


def others_running(samples: int = 20, every_s: float = 0.05) -> float:
    """Mean number of other runnable tasks right now (/proc/loadavg's running count, minus this one)."""
    counts = []
    for _ in range(samples):
        counts.append(int(open("/proc/loadavg").read().split()[3].split("/")[0]) - 1)
        time.sleep(every_s)
    return statistics.fmean(counts)


class ForeignLoad:
    """CPU time other people's processes took while a block ran, as a share of the machine.

    /proc/stat counts every process's CPU time; our own (this process and the
    children it waited for) is subtracted."""

    def __enter__(self):
        self.t0, self.busy0, self.ours0 = time.time(), _busy_cpu_s(), _our_cpu_s()
        return self

    def __exit__(self, *exc):
        wall = time.time() - self.t0
        foreign = (_busy_cpu_s() - self.busy0) - (_our_cpu_s() - self.ours0)
        self.share = max(0.0, foreign) / (wall * len(os.sched_getaffinity(0)))
        return False


def _busy_cpu_s() -> float:
    user, nice, system, _idle, _iowait, irq, softirq = map(int, open("/proc/stat").readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _our_cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def wait_for_quiet(limit: float, patience_s: float) -> float:
    """Wait until other processes leave the cores (at most `patience_s`); returns what was seen last."""
    deadline = time.time() + patience_s
    busy = others_running()
    while busy > limit and time.time() < deadline:
        time.sleep(5)
        busy = others_running()
    return busy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Quiet:
    """Runs a measurement when nobody else is busy, and again if someone was busy during it.

    Before: wait until on average at most `max_busy` other tasks are runnable.
    During: ForeignLoad; a run during which others took more than `max_foreign`
    of the machine is repeated (at most `retries` times; the last one is kept
    and its share reported either way)."""

    def __init__(self, max_busy: float, max_foreign: float, patience_s: float, retries: int):
        self.max_busy, self.max_foreign, self.patience_s, self.retries = max_busy, max_foreign, patience_s, retries

    def __call__(self, fn, what: str):
        for attempt in range(self.retries + 1):
            wait_for_quiet(self.max_busy, self.patience_s)
            with ForeignLoad() as foreign:
                result = fn()
            if foreign.share <= self.max_foreign:
                break
            print(f"{what}: others used {foreign.share:.0%} of the machine meanwhile"
                  + ("; again" if attempt < self.retries else "; kept anyway"), file=sys.stderr, flush=True)
        return result, round(foreign.share, 3)


def profile(work: Path, worlds: set[int], quick: bool, quiet: Quiet) -> tuple[dict[int, Path], dict[str, float]]:
    """A profile directory per process count (each with the network fit); foreign load during each."""
    dirs, foreign = {}, {}
    net = work / "network.json"
    t0 = time.time()
    _, foreign["network"] = quiet(lambda: sailor("profile", "network", "--local", "2", "-o", str(net), "--plot",
                                                 str(work / "network.png")), "network profile")
    for n in sorted(worlds):
        d = work / f"profiles-c{n}"
        _, foreign[f"model, {n} busy processes"] = quiet(lambda: sailor(
            "profile", "model", "--model", MODEL, "--device", "cpu", "--micro-batch-sizes", "1,2,4,8", "--tp", "1,2",
            "--concurrency", str(n), "--repeats", "10" if quick else "20", "-o", str(d), "--quiet"),
            f"model profile with {n} processes")
        shutil.copy(net, d / "network.json")
        dirs[n] = d
    print(f"profiled in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return dirs, foreign


def simulate(plan_path: Path, profiles: Path) -> dict:
    d = json.loads(sailor("simulate", str(plan_path), "--profiles", str(profiles), "--json").stdout)
    return {"iteration_s": d["iteration_time_s"], "pipeline_s": d["pipeline_time_s"], "sync_s": d["sync_time_s"],
            "stage_compute_s": [s["compute_s"] for s in d["stages"]]}


def train(plan_path: Path, work: Path, iters: int, env: dict | None = None) -> list[dict] | str:
    """The metrics lines of one training run of the plan (`sailor launch --local`), or its error output."""
    metrics = work / f"{plan_path.stem}.metrics.jsonl"
    metrics.unlink(missing_ok=True)
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(plan_path), "--local", "--master-port",
                          str(free_port()), "--", "--train-iters", str(iters), "--metrics-file", str(metrics),
                          "--log-interval", "0"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                              "PYTHONWARNINGS": "ignore", **(env or {})})
    if out.returncode:
        return (out.stderr or out.stdout)[-3000:]
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def run_plan(plan_path: Path, work: Path, steps: int, warmup: int) -> float:
    """Median step time after warm-up of one training run of the plan."""
    lines = train(plan_path, work, warmup + steps, {"OMP_NUM_THREADS": "1"})
    if isinstance(lines, str):
        raise SystemExit(f"training run of {plan_path.name} failed:\n{lines}")
    return statistics.median(m["step_time_s"] for m in lines[warmup:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--keep", metavar="DIR", help="keep profiles, plans and metrics here")
    ap.add_argument("--quick", action="store_true", help="two plans, one round, fewer repetitions")
    ap.add_argument("--max-busy", type=float, default=0.5,
                    help="before each measurement wait until at most this many other tasks are runnable on "
                         "average (default 0.5)")
    ap.add_argument("--max-foreign", type=float, default=0.1,
                    help="repeat a measurement during which others used more than this share of the machine "
                         "(default 0.1)")
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--patience", type=float, default=600, help="seconds to wait for a quiet machine (default 600)")
    args = ap.parse_args()
    rounds, steps = (1, 10) if args.quick else (args.rounds, args.steps)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sailor-simreal-"))
    work.mkdir(parents=True, exist_ok=True)
    plans = {k: v for k, v in PLANS.items() if not args.quick or k in QUICK}
    cores = len(os.sched_getaffinity(0))
    quiet = Quiet(args.max_busy, args.max_foreign, args.patience, args.retries)

    # profiles for every process count a plan may use (the planner's pick uses at most `cores`)
    dirs, profile_foreign = profile(work, {world_of(p) for p in plans.values()} | set(range(1, cores + 1)),
                                    args.quick, quiet)
    # the planner's own pick for a "cluster" of as many CPU processes as cores
    picked = work / "plan-planner.json"
    sailor("plan", "--model", MODEL, "--gpus", f"CPU@local={cores}", "--global-batch", str(GBS), "--profiles",
           str(dirs[cores]), "--microbatch-sizes", "1,2,4,8", "-o", str(picked), "--json")
    plans[f"planner's pick for {cores} CPU processes"] = json.loads(picked.read_text())

    paths = {}
    for i, (name, plan) in enumerate(plans.items()):
        paths[name] = work / f"plan{i}.json"
        paths[name].write_text(json.dumps(plan, indent=1))
    measured: dict[str, list[float]] = {name: [] for name in plans}
    foreign: dict[str, list[float]] = {name: [] for name in plans}
    names = list(plans)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each round
            median, share = quiet(lambda: run_plan(paths[name], work, steps, args.warmup), name)
            measured[name].append(median)
            foreign[name].append(share)
            print(f"round {r + 1}: {name}: {median * 1e3:.1f} ms (others used {share:.0%} of the machine)",
                  file=sys.stderr, flush=True)
    rows = []
    for name, plan in plans.items():
        n = world_of(plan)
        sim = simulate(paths[name], dirs[n])
        real = statistics.median(measured[name])
        rows.append({"plan": name, "layout": describe(plan), "ranks": n, "profile": f"--concurrency {n}",
                     "predicted_s": round(sim["iteration_s"], 5), "measured_s": round(real, 5),
                     "error_pct": round(100 * (sim["iteration_s"] - real) / real, 1),
                     "measured_per_round_s": [round(x, 5) for x in measured[name]],
                     "foreign_cpu_share_per_round": foreign[name],
                     "predicted_detail": {k: (round(v, 5) if isinstance(v, float) else [round(x, 5) for x in v])
                                          for k, v in sim.items()}})
    errors = [abs(r["error_pct"]) for r in rows]
    print(json.dumps({"model": MODEL, "device": "cpu", "cores": cores, "threads_per_rank": 1, "rounds": rounds,
                      "steps_per_round": steps, "warmup_steps": args.warmup, "work_dir": str(work),
                      "foreign_cpu_share_while_profiling": profile_foreign,
                      "mean_abs_error_pct": round(statistics.fmean(errors), 1), "max_abs_error_pct": max(errors),
                      "plans": rows}, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
