"""The `sailor` command: the only place in the planner that prints.

    sailor simulate PLAN [--model NAME] [--seq-length N] [--profiles DIR] [--cluster FILE] [--json]
    sailor plan --model NAME [--seq-length N] [--gpus TYPE@ZONE=N,...] [--global-batch N] [--objective ...] ...

Every user mistake ends in one line `sailor: error: ...` and exit code 2.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from pathlib import Path

from planner.errors import SailorError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profiles", action="append", metavar="DIR",
                   help="profiles directory (Sailor's data layout or ours); repeatable; default $SAILOR_PROFILES")
    p.add_argument("--cluster", metavar="FILE", help="cluster file (YAML/JSON): GPU types, zones, prices, availability")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="training precision the profiles describe (default fp32)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print nothing but errors (files are still written; the exit code tells the outcome)")


def _seq_length_option(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--seq-length", type=int, metavar="TOKENS", help=f"training sequence length (default: {default})")


SEQ_DEFAULT = "a preset's own; a config.json's min(2048, its context length)"


def _context(args, model):
    """(cluster, simulator) for `model` (a ModelSpec), with the profiles that apply to it."""
    from planner.profiles.store import load_profiles
    from planner.simulator.simulate import Simulator
    from planner.specs.hardware import load_cluster

    cluster = load_cluster(args.cluster)
    store = load_profiles(args.profiles, dict(cluster.gpus), model)
    return cluster, Simulator(model, cluster, store, args.precision)


def _seq_length(model, args, planned: int | None = None) -> dict:
    """The sequence length used and why, for the output."""
    from planner.specs.model import seq_length_reason

    return {"seq_length": model.seq_len, "seq_length_source": seq_length_reason(model, args.seq_length, planned)}


def _print_seq_length(seq: dict) -> None:
    print(f"sequence length {seq['seq_length']} ({seq['seq_length_source']})")


# -- simulate ----------------------------------------------------------------
def cmd_simulate(args) -> int:
    from planner.simulator.runtime_model import runtime_model
    from planner.specs.plan import load_plan, plan_model

    plan = load_plan(args.plan)
    model = plan_model(plan, args.model, args.seq_length)
    _, sim = _context(args, model)
    seq = _seq_length(model, args, plan.seq_length)
    rt = runtime_model(args.runtime) if args.runtime else None
    est = sim.simulate(plan, rt)
    if args.plot:
        from planner.plots import plot_plan

        plot_plan(plan, est, sim, args.plot, title=f"{model.name}: {Path(args.plan).name}")
    from planner.provenance import provenance

    estimated = provenance(sim, plan, args.model or plan.model)
    if args.json:
        out = est.to_dict()
        out["plan"] = args.plan
        out["model"] = model.name
        out.update(seq)
        out["runtime"] = args.runtime or plan.runtime
        out["estimated"] = estimated.to_dict()
        print(json.dumps(out, indent=1))
        return 0
    from planner.report import print_estimate

    print_estimate(est, title=f"{model.name}: {Path(args.plan).name} on {plan.runtime if not args.runtime else args.runtime}",
                   provenance=estimated)
    _print_seq_length(seq)
    return 0


# -- plan --------------------------------------------------------------------
EXAMPLE_CLUSTER = "A100-40@us-central1-a=32,V100-16@us-central1-a=32,A100-40@us-west1-b=16"


def cmd_plan(args) -> int:
    from planner.search.goal import Goal
    from planner.search.planner import Planner
    from planner.specs.hardware import parse_gpus
    from planner.specs.model import get_model
    from planner.specs.plan import plan_to_dict, save_plan

    model = get_model(args.model, args.seq_length)
    cluster, sim = _context(args, model)
    if args.gpus or not cluster.available:
        cluster = cluster.with_available(parse_gpus(args.gpus or EXAMPLE_CLUSTER, cluster))
        sim.cluster = cluster
    goal = Goal(args.objective, args.max_cost_per_iter, args.max_cost_per_hour, args.min_throughput, args.max_gpus)
    planner = Planner(sim, args.global_batch, goal, args.runtime, args.max_stages,
                      [int(b) for b in args.microbatch_sizes.split(",")] if args.microbatch_sizes else None,
                      recompute=args.recompute)
    result = planner.run(top=args.top, pareto=args.pareto or bool(args.plot))
    if args.plot and result.pareto:
        from planner.plots import plot_pareto

        plot_pareto(result.pareto, args.plot, title=f"{model.name}: throughput vs cost of the best plans")
    if not result.plans:
        from planner.search.explain import explain_infeasible

        raise SailorError(explain_infeasible(planner, goal))
    best_plan, best = result.plans[0]
    if args.output:
        save_plan(best_plan, args.output, "sailor" if args.format == "sailor" else "sailor-plan")
    from planner.provenance import provenance

    def summary(plan, est) -> dict:
        return {**_summary(plan, est), "estimated": provenance(sim, plan, args.model).to_dict()}

    seq = _seq_length(model, args)
    if args.json:
        out = {
            "plan": plan_to_dict(best_plan),
            **seq,
            "estimated": provenance(sim, best_plan, args.model).to_dict(),
            "iteration_time_s": best.iteration_time_s,
            "throughput_iters_per_s": best.throughput_iters_per_s,
            "cost_per_iteration_usd": best.cost_per_iteration_usd,
            "cost_per_hour_usd": best.cost_per_hour_usd,
            "gpus_used": best.gpus_used,
            "peak_memory_bytes": best.peak_memory_bytes,
            "search_time_s": result.search_time_s,
            "plans_evaluated": result.evaluated,
            "top": [summary(p, e) for p, e in result.plans],
        }
        if args.pareto:
            out["pareto"] = [summary(p, e) for p, e in result.pareto]
        print(json.dumps(out, indent=1))
        return 0
    from planner.report import print_plans

    shown = result.pareto if args.pareto else result.plans
    print_plans(shown, title=f"{model.name}, global batch "
                f"{args.global_batch}, objective {args.objective}" + (" (Pareto front)" if args.pareto else ""),
                provenances=[provenance(sim, p, args.model) for p, _ in shown])
    _print_seq_length(seq)
    print(f"search: {result.search_time_s:.2f} s CPU, {result.evaluated} candidate plans evaluated"
          + (f"; best plan written to {args.output}" if args.output else ""))
    return 0


def _summary(plan, est) -> dict:
    return {"stages": plan.pp, "replicas": plan.dp, "tp": sorted({r.tp for s in plan.stages for r in s.replicas}),
            "recompute": plan.recompute,
            "microbatch_size": plan.pipelines[0].microbatch_size, "iteration_time_s": est.iteration_time_s,
            "throughput_iters_per_s": est.throughput_iters_per_s, "cost_per_iteration_usd": est.cost_per_iteration_usd,
            "cost_per_hour_usd": est.cost_per_hour_usd, "gpus_used": est.gpus_used,
            "peak_memory_bytes": est.peak_memory_bytes,
            "layers_per_stage": [[s.first, s.last] for s in plan.stages]}


# -- replay ------------------------------------------------------------------
def cmd_replay(args) -> int:
    from planner.replay import load_trace, planner_for, replay
    from planner.search.goal import Goal
    from planner.specs.model import get_model

    model = get_model(args.model, args.seq_length)
    cluster, sim = _context(args, model)
    trace = load_trace(args.trace, args.gpu, args.zone)
    for snap in trace:
        for p in snap.pools:
            cluster.gpu(p.gpu)  # unknown GPU types fail here, with the usual message

    def sim_for(pools):
        from planner.simulator.simulate import Simulator

        return Simulator(model, cluster.with_available(pools), sim.profiles, args.precision)

    plan_for = planner_for(sim_for, args.global_batch, Goal(args.objective), args.runtime)
    runs = [replay(trace, plan_for, policy, args.restart_s) for policy in args.policies.split(",")]
    if args.plot:
        from planner.plots import plot_replay

        plot_replay(runs, args.plot, title=f"{model.name} on {Path(args.trace).name}")
    seq = _seq_length(model, args)
    if args.json:
        print(json.dumps({"trace": args.trace, "model": model.name, **seq, "restart_s": args.restart_s,
                          "summary": [r.summary() for r in runs],
                          "steps": {r.policy: [vars(s) for s in r.steps] for r in runs}}, indent=1))
        return 0
    from planner.report import print_replay

    print_replay(runs, title=f"{model.name}: {Path(args.trace).name} ({len(trace)} snapshots, restart {args.restart_s:g} s)")
    _print_seq_length(seq)
    return 0


# Commands in modules of their own: each has add_parser(subparsers, add_common_options) and sets
# args.func. Imported only when their command runs (or for the full help), which keeps
# `sailor plan`'s start-up free of the elastic, profiling and data machinery.
BUILTIN_COMMANDS = ("simulate", "plan", "replay")
COMMAND_MODULES: dict[str, str] = {
    "launch": "planner.launch",
    "profile": "planner.profile_cli",
    "run": "planner.elastic.controller",
    "agent": "planner.elastic.agent",
    "export": "planner.export_cli",
    "data": "planner.data_cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (command given) the built-in commands plus that command's module."""
    ap = argparse.ArgumentParser(prog="sailor", description="Plan, simulate and run transformer training on "
                                 "heterogeneous, geo-distributed GPUs.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("simulate", help="predict iteration time, memory and cost of a plan")
    p.add_argument("plan", help="plan file: ours, or Sailor's plan_config JSON (detected)")
    p.add_argument("--model", help="model preset, Sailor name or config.json (default: the plan's)")
    _seq_length_option(p, "the plan's; for plans that record none, " + SEQ_DEFAULT + "; one that contradicts "
                       "the plan is refused")
    p.add_argument("--runtime", choices=["sailor", "megatron-deepspeed"],
                   help="framework that runs the plan (default: the plan's; Sailor-format plans: megatron-deepspeed)")
    p.add_argument("--plot", metavar="FILE", help="write the pipeline timeline and memory per stage (PNG/SVG)")
    _common(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("plan", help="find the best GPU allocation and parallelization plan")
    p.add_argument("--model", required=True, help="model preset, Sailor name or config.json")
    _seq_length_option(p, SEQ_DEFAULT)
    p.add_argument("--gpus", metavar="TYPE@ZONE=N,...",
                   help=f"available GPUs (default: the cluster file's, else {EXAMPLE_CLUSTER})")
    p.add_argument("--global-batch", type=int, default=1024, help="samples per iteration (default 1024)")
    p.add_argument("--objective", default="throughput", choices=["throughput", "cost", "cost-per-token"])
    p.add_argument("--max-cost-per-iter", type=float, metavar="USD")
    p.add_argument("--max-cost-per-hour", type=float, metavar="USD")
    p.add_argument("--min-throughput", type=float, metavar="ITERS_PER_S")
    p.add_argument("--max-gpus", type=int)
    p.add_argument("--top", type=int, default=3, help="how many plans to list (default 3)")
    p.add_argument("--pareto", action="store_true", help="list the throughput-vs-cost frontier instead")
    p.add_argument("-o", "--output", default="plan.json", help="where to write the best plan (default plan.json)")
    p.add_argument("--format", default="sailor-plan", choices=["sailor-plan", "sailor"],
                   help="plan file format: ours, or Sailor's plan_config")
    p.add_argument("--runtime", default="sailor", choices=["sailor", "megatron-deepspeed"],
                   help="framework the plan is for (default: sailor's own runtime)")
    p.add_argument("--max-stages", type=int, help="deepest pipeline to consider (default: one layer per stage)")
    p.add_argument("--microbatch-sizes", help="only these microbatch sizes, e.g. 1,2,4")
    p.add_argument("--recompute", choices=("auto", "never", "always"), default="auto",
                   help="activation recomputation: where it makes a better plan possible (auto, the default), "
                        "never, or on every stage")
    p.add_argument("--plot", metavar="FILE", help="write the throughput-vs-cost Pareto front (PNG/SVG)")
    _common(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("replay", help="replay a GPU-availability trace through planner and simulator")
    p.add_argument("trace", help="Sailor's CSV (,Timestamp,GPU_zone,...) or JSON ([{Time, GPUs}]) trace")
    p.add_argument("--model", required=True, help="model preset, Sailor name or config.json")
    _seq_length_option(p, SEQ_DEFAULT)
    p.add_argument("--gpu", default="A100-40", help="GPU type of JSON traces (default A100-40)")
    p.add_argument("--zone", default="us-central1-a", help="zone of JSON traces (default us-central1-a)")
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--objective", default="throughput", choices=["throughput", "cost", "cost-per-token"])
    p.add_argument("--restart-s", type=float, default=30.0,
                   help="seconds without progress per reconfiguration (default 30)")
    p.add_argument("--policies", default="sailor,homogeneous,static")
    p.add_argument("--runtime", default="sailor", choices=["sailor", "megatron-deepspeed"])
    p.add_argument("--plot", metavar="FILE", help="write throughput, iterations and cost over time (PNG/SVG)")
    _common(p)
    p.set_defaults(func=cmd_replay)

    for name, module in COMMAND_MODULES.items():
        if command is None or command == name:
            importlib.import_module(module).add_parser(sub, _common)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    ap = build_parser(command if command in BUILTIN_COMMANDS or command in COMMAND_MODULES else None)
    args = ap.parse_args(argv)
    try:
        if getattr(args, "quiet", False):
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
                return args.func(args)
        return args.func(args)
    except SailorError as e:
        print(f"sailor: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a path the user gave that cannot be read or written
        where = f" {e.filename}" if e.filename else ""
        print(f"sailor: error: cannot use{where}: {e.strerror or e}; check the path and its permissions",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sailor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
