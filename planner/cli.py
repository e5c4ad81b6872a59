"""The `sailor` command: the only place in the planner that prints.

    sailor simulate PLAN [--model NAME] [--seq-length N] [--profiles DIR] [--cluster FILE] [--json]
    sailor plan --model NAME [--seq-length N] [--gpus TYPE@ZONE=N,...] [--global-batch N] [--objective ...] ...

Every user mistake ends in one line `sailor: error: ...` and exit code 2: flags
are typed and range-checked by argparse (planner/flags.py), files field by field
where they are read (planner/inputs.py). Anything else that goes wrong is a bug
in sailor: one line saying so, exit code 1 (SAILOR_TRACEBACK=1 shows where).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from pathlib import Path

from planner import flags
from planner.errors import SailorError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profiles", action="append", metavar="DIR", type=flags.nonempty("a directory"),
                   help="profiles directory (Sailor's data layout or ours); repeatable; default $SAILOR_PROFILES")
    p.add_argument("--cluster", metavar="FILE", type=flags.nonempty("a file"),
                   help="cluster file (YAML/JSON): GPU types, zones, prices, availability")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                   help="training precision (default: a plan's own; else bf16 on GPUs, fp16 if a GPU type lacks "
                        "bf16 (V100, T4, Turing), fp32 on CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print nothing but errors (files are still written; the exit code tells the outcome)")


def _seq_length_option(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--seq-length", type=flags.seq_length, metavar="TOKENS",
                   help=f"training sequence length (default: {default})")


SEQ_DEFAULT = "a preset's own; a config.json's min(2048, its context length)"


def _context(args, model, plan=None, cluster=None):
    """(cluster, simulator) for `model` (a ModelSpec), with the profiles that apply to it, in the command's
    precision: the plan's, else --precision, else the default for its GPU types (or the cluster's); for the
    command's runtime: --runtime, else the plan's, else ours."""
    from planner.profiles.store import load_profiles
    from planner.simulator.simulate import Simulator
    from planner.specs.hardware import load_cluster
    from planner.specs.precision import resolve_precision

    cluster = cluster or load_cluster(args.cluster)
    gpus = {r.gpu for s in plan.stages for r in s.replicas} if plan else {p.gpu for p in cluster.available}
    precision = resolve_precision(args.precision, [cluster.gpu(g) for g in sorted(gpus)],
                                  plan.precision if plan else None)
    runtime = getattr(args, "runtime", None) or (plan.runtime if plan else "sailor")
    store = load_profiles(args.profiles, dict(cluster.gpus), model, runtime)
    for note in [] if getattr(args, "quiet", False) else store.skipped:  # (--quiet: errors only)
        print(f"sailor: note: {note}", file=sys.stderr)
    return cluster, Simulator(model, cluster, store, precision)


def _seq_length(model, args, planned: int | None = None) -> dict:
    """The sequence length used and why, for the output."""
    from planner.specs.model import seq_length_reason

    return {"seq_length": model.seq_len, "seq_length_source": seq_length_reason(model, args.seq_length, planned)}


def _print_seq_length(seq: dict) -> None:
    print(f"sequence length {seq['seq_length']} ({seq['seq_length_source']})")


def _model_files(name: str | None) -> list[Path]:
    """The files a --model names, if it is a config.json or a model directory (inputs never overwritten)."""
    if not name:
        return []
    p = Path(name)
    return [p, p / "config.json"] if p.is_dir() else [p] if p.exists() else []


def _inputs(args, *files) -> list:
    """Every file and directory the command reads: no output may replace one of them."""
    return [*files, args.cluster, *(args.profiles or []), *_model_files(getattr(args, "model", None))]


def _plot_target(args, inputs: list, *others) -> None:
    """--plot: matplotlib must be there and the file must be writable, before anything is computed or written."""
    from planner.outputs import check_output

    if args.plot:
        flags.require_module("matplotlib", "plot", "--plot")
        if any(o is not None and Path(o).resolve() == Path(args.plot).resolve() for o in others):
            raise SailorError(f"--plot {args.plot} is also where the plan goes; give the plot another name")
        check_output(args.plot, inputs, "--plot")


def _save_plot(draw, path: str, inputs: list, *args, **kw) -> None:
    from planner.outputs import atomic_path

    with atomic_path(path, inputs, "--plot") as tmp:
        draw(*args, str(tmp), **kw)


# -- simulate ----------------------------------------------------------------
def cmd_simulate(args) -> int:
    from planner.simulator.runtime_model import runtime_model
    from planner.specs.plan import check_plan_for, load_plan, plan_model

    inputs = _inputs(args, args.plan)
    _plot_target(args, inputs)
    plan = load_plan(args.plan)
    model = plan_model(plan, args.model, args.seq_length)
    cluster, sim = _context(args, model, plan)
    check_plan_for(plan, model, cluster, f"plan file {args.plan}")
    seq = _seq_length(model, args, plan.seq_length)
    rt = runtime_model(args.runtime) if args.runtime else None
    est = sim.simulate(plan, rt)
    if args.plot:
        from planner.plots import plot_plan

        _save_plot(plot_plan, args.plot, inputs, plan, est, sim, title=f"{model.name}: {Path(args.plan).name}")
    from planner.provenance import provenance

    # the model as `sailor profile model --model` takes it: a config.json's model by the plan that carries it
    estimated = provenance(sim, plan, args.model or (args.plan if plan.model_spec is not None else plan.model))
    if args.json:
        out = est.to_dict()
        out["plan"] = args.plan
        out["model"] = model.name
        out.update(seq)
        out["runtime"] = args.runtime or plan.runtime
        out["precision"] = sim.precision
        out["estimated"] = estimated.to_dict()
        print(json.dumps(out, indent=1))
        return 0
    from planner.report import print_estimate

    runtime = args.runtime or plan.runtime
    print_estimate(est, title=f"{model.name}: {Path(args.plan).name} on {runtime}, {sim.precision}",
                   provenance=estimated)
    _print_seq_length(seq)
    return 0


# -- plan --------------------------------------------------------------------
EXAMPLE_CLUSTER = "A100-40@us-central1-a=32,V100-16@us-central1-a=32,A100-40@us-west1-b=16"
SHORTLIST_DEPTH = 3  # the search keeps this many plans per row shown, so dominated ones can be left out


def cmd_plan(args) -> int:
    from planner.search.planner import gc_paused

    with gc_paused():  # reading the profiles, the search and the output: see gc_paused
        return _plan(args)


def _plan(args) -> int:
    from planner.outputs import check_output, write_output
    from planner.search.goal import Goal, shortlist
    from planner.search.planner import Planner
    from planner.specs.hardware import parse_gpus
    from planner.specs.model import get_model
    from planner.specs.plan import plan_text, plan_to_dict

    inputs = _inputs(args)
    check_output(args.output, inputs, "plan file (-o)")
    _plot_target(args, inputs, args.output)
    from planner.specs.hardware import load_cluster

    model = get_model(args.model, args.seq_length)
    from planner.specs.families import multimodal_note

    note = None if args.quiet else multimodal_note(args.model)
    if note:
        print(f"sailor: note: {note}", file=sys.stderr)
    cluster = load_cluster(args.cluster)
    if args.cluster and args.gpus is None and not cluster.available:  # not the example cluster in its place
        raise SailorError(f"cluster file {args.cluster} makes no GPUs available (no count above 0 under "
                          "'available:'); give counts under 'available:' or --gpus")
    if args.gpus is not None or not cluster.available:
        cluster = cluster.with_available(parse_gpus(EXAMPLE_CLUSTER if args.gpus is None else args.gpus, cluster,
                                                    "--gpus"))
    cluster, sim = _context(args, model, cluster=cluster)  # searched in the default for the GPU types offered
    goal = Goal(args.objective, args.max_cost_per_iter, args.max_cost_per_hour, args.min_throughput, args.max_gpus)
    planner = Planner(sim, args.global_batch, goal, args.runtime, args.max_stages,
                      list(args.microbatch_sizes) if args.microbatch_sizes else None, recompute=args.recompute,
                      distributed_optimizer=args.use_distributed_optimizer, type_chains=args.type_chains)
    result = planner.run(top=args.top if args.top == 1 else args.top * SHORTLIST_DEPTH,
                         pareto=args.pareto or bool(args.plot))
    if not result.plans:
        from planner.search.explain import explain_infeasible

        raise SailorError(explain_infeasible(planner, goal))
    plans, pareto = shortlist(result.plans)[:args.top], result.pareto
    sims = {sim.precision: sim}
    if args.precision is None:
        own = _own_precision(sims)
        plans, pareto = [own(p, e) for p, e in plans], [own(p, e) for p, e in pareto]
    best_plan, best = plans[0]
    text = plan_text(best_plan, "sailor" if args.format == "sailor" else "sailor-plan")
    if args.plot and pareto:
        from planner.plots import plot_pareto

        _save_plot(plot_pareto, args.plot, inputs, pareto,
                   title=f"{model.name}: throughput vs cost of the best plans")
    write_output(args.output, text, inputs, "plan file (-o)")
    from planner.provenance import provenance

    def origin(plan):
        return provenance(sims[plan.precision], plan, args.model)

    def summary(plan, est) -> dict:
        return {**_summary(plan, est), "estimated": origin(plan).to_dict()}

    seq = _seq_length(model, args)
    if args.json:
        out = {
            "plan": plan_to_dict(best_plan),
            **seq,
            "precision": best_plan.precision,
            "distributed_optimizer": best_plan.distributed_optimizer,
            "estimated": origin(best_plan).to_dict(),
            "iteration_time_s": best.iteration_time_s,
            "throughput_iters_per_s": best.throughput_iters_per_s,
            "cost_per_iteration_usd": best.cost_per_iteration_usd,
            "cost_per_hour_usd": best.cost_per_hour_usd,
            "gpus_used": best.gpus_used,
            "peak_memory_bytes": best.peak_memory_bytes,
            "search_time_s": result.search_time_s,
            "plans_evaluated": result.evaluated,
            "not_searched": result.not_searched,
            "top": [summary(p, e) for p, e in plans],
        }
        if args.pareto:
            out["pareto"] = [summary(p, e) for p, e in pareto]
        print(json.dumps(out, indent=1))
        return 0
    from planner.report import print_plans

    shown = pareto if args.pareto else plans
    print_plans(shown, title=f"{model.name}, global batch "
                f"{args.global_batch}, objective {args.objective}" + (" (Pareto front)" if args.pareto else ""),
                provenances=[origin(p) for p, _ in shown])
    _print_seq_length(seq)
    precisions = [p.precision for p, _ in shown]
    print((f"precision {precisions[0]}" if len(set(precisions)) == 1 else
           "precision: " + ", ".join(f"plan {i} {prec}" for i, prec in enumerate(precisions, 1)))
          + (", distributed optimizer (each stage's optimizer state split over its replicas)"
             if best_plan.distributed_optimizer else ""))
    print(f"search: {result.search_time_s:.2f} s CPU, {result.evaluated} candidate plans evaluated; best plan written "
          f"to {args.output}" + (f", plot to {args.plot}" if args.plot and result.pareto else ""))
    for line in result.not_searched:
        print(f"not searched: {line}")
    return 0


def _own_precision(sims: dict):
    """(plan, estimate) -> the same in the default precision of the plan's own GPU types.

    The search runs in the default for all GPU types offered: fp16 if any of them lacks bf16. A plan
    that uses none of those trains in bf16, as the default rule says for its GPUs
    (specs/precision.py); its numbers come from a bf16 simulation (on GPUs with both they equal
    fp16's: the same peak FLOP/s and bytes). `sims` maps precision -> Simulator; new ones are added."""
    from dataclasses import replace

    from planner.simulator.simulate import Simulator
    from planner.specs.precision import default_precision

    sim = next(iter(sims.values()))

    def own(plan, est):
        precision = default_precision(sim.cluster.gpu(g) for g in sorted({g for g, _ in plan.gpus_used()}))
        if precision == plan.precision:
            return plan, est
        if precision not in sims:
            sims[precision] = Simulator(sim.model, sim.cluster, sim.profiles, precision)
        plan = replace(plan, precision=precision)
        return plan, sims[precision].simulate(plan)
    return own


def _summary(plan, est) -> dict:
    return {"stages": plan.pp, "replicas": plan.dp, "tp": sorted({r.tp for s in plan.stages for r in s.replicas}),
            "precision": plan.precision, "recompute": plan.recompute,
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

    inputs = _inputs(args, args.trace)
    _plot_target(args, inputs)
    model = get_model(args.model, args.seq_length)
    cluster, sim = _context(args, model)
    trace = load_trace(args.trace, args.gpu, args.zone, cluster)

    def sim_for(pools):
        from planner.simulator.simulate import Simulator

        from planner.specs.precision import resolve_precision

        precision = resolve_precision(args.precision, [cluster.gpu(p.gpu) for p in pools])
        return Simulator(model, cluster.with_available(pools), sim.profiles, precision)

    plan_for = planner_for(sim_for, args.global_batch, Goal(args.objective), args.runtime)
    runs = [replay(trace, plan_for, policy, args.restart_s) for policy in args.policies]
    if args.plot:
        from planner.plots import plot_replay

        _save_plot(plot_replay, args.plot, inputs, runs, title=f"{model.name} on {Path(args.trace).name}")
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
# `sailor plan`'s start-up free of the elastic, profiling and data machinery. The parser of a
# command line holds only its command's options (the whole one is built for a mistake's message).
COMMAND_MODULES: dict[str, str] = {
    "launch": "planner.launch",
    "profile": "planner.profile_cli",
    "run": "planner.elastic.controller",
    "agent": "planner.elastic.agent",
    "export": "planner.export_cli",
    "data": "planner.data_cli",
    "list": "planner.list_cli",
}
OBJECTIVES = ("throughput", "cost", "cost-per-token")
OBJECTIVE_HELP = ("what the best plan maximizes or minimizes: throughput (iterations/s, the default), cost "
                  "(dollars per iteration) or cost-per-token (ranks as cost: the batch is fixed)")
RUNTIMES = ("sailor", "megatron-deepspeed")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("sailor")
    except PackageNotFoundError:
        from planner import __version__

        return __version__


class _Version(argparse.Action):
    """--version, looked up only when asked (importlib.metadata costs a `sailor plan` 13 ms)."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"sailor {version()}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (command given) only that command's."""
    ap = flags.Parser(prog="sailor", description="Plan, simulate and run transformer training on "
                      "heterogeneous, geo-distributed GPUs.")
    ap.add_argument("--version", action=_Version, help="print sailor's version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")
    for name, add in BUILTIN_COMMANDS.items():
        if command is None or command == name:
            add(sub)
    for name, module in COMMAND_MODULES.items():
        if command is None or command == name:
            importlib.import_module(module).add_parser(sub, _common)
    return ap


def _simulate_parser(sub) -> None:
    p = sub.add_parser("simulate", help="predict iteration time, memory and cost of a plan")
    p.add_argument("plan", help="plan file: ours, or Sailor's plan_config JSON (detected)")
    p.add_argument("--model", type=flags.nonempty("a model"),
                   help="model preset, Sailor name or config.json (default: the plan's)")
    _seq_length_option(p, "the plan's; for plans that record none, " + SEQ_DEFAULT + "; one that contradicts "
                       "the plan is refused")
    p.add_argument("--runtime", choices=RUNTIMES,
                   help="framework that runs the plan (default: the plan's; Sailor-format plans: megatron-deepspeed)")
    p.add_argument("--plot", metavar="FILE", type=flags.plot_file,
                   help="write the pipeline timeline and memory per stage (.png, .svg or .pdf; needs matplotlib)")
    _common(p)
    p.set_defaults(func=cmd_simulate)


def _plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="find the best GPU allocation and parallelization plan")
    p.add_argument("--model", required=True, type=flags.nonempty("a model"),
                   help="model preset, Sailor name or config.json (see `sailor list models`)")
    _seq_length_option(p, SEQ_DEFAULT)
    p.add_argument("--gpus", metavar="TYPE@ZONE=N,...",
                   help=f"available GPUs (see `sailor list gpus` and `sailor list zones`; default: the cluster "
                        f"file's, else {EXAMPLE_CLUSTER})")
    p.add_argument("--global-batch", type=flags.batch, default=1024, metavar="SAMPLES",
                   help="samples per iteration (default 1024)")
    p.add_argument("--objective", default="throughput", choices=OBJECTIVES, help=OBJECTIVE_HELP)
    p.add_argument("--max-cost-per-iter", type=flags.budget, metavar="USD",
                   help="only plans that cost at most this many dollars per iteration (GPUs and egress)")
    p.add_argument("--max-cost-per-hour", type=flags.budget, metavar="USD",
                   help="only plans that cost at most this many dollars per hour of training")
    p.add_argument("--min-throughput", type=flags.budget, metavar="ITERS_PER_S",
                   help="only plans that do at least this many iterations per second")
    p.add_argument("--max-gpus", type=flags.count, metavar="N", help="only plans that use at most N GPUs")
    p.add_argument("--top", type=flags.integer(1, 100), default=3, metavar="N",
                   help="how many plans to list (default 3); plans a better-ranked one beats on both time and cost "
                        "are left out")
    p.add_argument("--pareto", action="store_true", help="list the throughput-vs-cost frontier instead")
    p.add_argument("-o", "--output", default="plan.json", metavar="FILE", type=flags.nonempty("a file name"),
                   help="where to write the best plan (default plan.json; written atomically)")
    p.add_argument("--format", default="sailor-plan", choices=["sailor-plan", "sailor"],
                   help="plan file format: ours, or Sailor's plan_config")
    p.add_argument("--runtime", default="sailor", choices=RUNTIMES,
                   help="framework the plan is for (default: sailor's own runtime)")
    p.add_argument("--max-stages", type=flags.integer(1, 1 << 16), metavar="N",
                   help="deepest pipeline to consider (default: one layer per stage)")
    p.add_argument("--microbatch-sizes", type=flags.int_list(), metavar="1,2,4",
                   help="only these microbatch sizes, e.g. 1,2,4")
    p.add_argument("--recompute", choices=("auto", "never", "always"), default="auto",
                   help="activation recomputation: where it makes a better plan possible (auto, the default), "
                        "never, or on every stage")
    p.add_argument("--use-distributed-optimizer", action="store_true",
                   help="plans split each stage's optimizer state and step over its replicas (ZeRO-1, the "
                        "runtime's flag of that name, which the plan then turns on): less memory per GPU")
    p.add_argument("--type-chains", choices=("auto", "always"), default="auto",
                   help="pipelines through three type@zone pools of two or three GPU types (on clusters of at "
                        "most six pools): on clusters of at most 32 GPUs or where nothing else fits (auto, the "
                        "default), or on any cluster (always: slower, seconds on hundreds of GPUs)")
    p.add_argument("--plot", metavar="FILE", type=flags.plot_file,
                   help="write the throughput-vs-cost Pareto front (.png, .svg or .pdf; needs matplotlib)")
    _common(p)
    p.set_defaults(func=cmd_plan)


def _replay_parser(sub) -> None:
    from planner.replay import POLICIES

    p = sub.add_parser("replay", help="replay a GPU-availability trace through planner and simulator")
    p.add_argument("trace", help="Sailor's CSV (,Timestamp,GPU_zone,...) or JSON ([{Time, GPUs}]) trace")
    p.add_argument("--model", required=True, type=flags.nonempty("a model"),
                   help="model preset, Sailor name or config.json")
    _seq_length_option(p, SEQ_DEFAULT)
    p.add_argument("--gpu", help="GPU type of JSON traces (default A100-40)")
    p.add_argument("--zone", help="zone of JSON traces and of CSV columns without one (default us-central1-a)")
    p.add_argument("--global-batch", type=flags.batch, default=1024, metavar="SAMPLES",
                   help="samples per iteration (default 1024)")
    p.add_argument("--objective", default="throughput", choices=OBJECTIVES, help=OBJECTIVE_HELP)
    p.add_argument("--restart-s", type=flags.number(lo=0.0, hi=1e9), default=30.0, metavar="SECONDS",
                   help="seconds without progress per reconfiguration (default 30)")
    p.add_argument("--policies", type=flags.choice_list(POLICIES), default=POLICIES, metavar=",".join(POLICIES),
                   help=f"which policies to replay, comma-separated (default: all; {POLICIES[0]}: re-plan on every "
                        f"change; {POLICIES[1]}: only one GPU type in one zone; {POLICIES[2]}: one plan for the "
                        "GPUs available throughout)")
    p.add_argument("--runtime", default="sailor", choices=RUNTIMES,
                   help="framework the plans are for (default: sailor's own runtime)")
    p.add_argument("--plot", metavar="FILE", type=flags.plot_file,
                   help="write throughput, iterations and cost over time (.png, .svg or .pdf; needs matplotlib)")
    _common(p)
    p.set_defaults(func=cmd_replay)


BUILTIN_COMMANDS = {"simulate": _simulate_parser, "plan": _plan_parser, "replay": _replay_parser}


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse with the parts of the parser the command needs; a mistake is parsed again with the
    whole parser, so its message knows every command."""
    # Training arguments after '--' are cut off here: argparse drops a '--' that follows a positional
    # (`sailor launch plan.json -- --train-iters 3`), so the commands could not tell where they begin.
    cut = argv.index("--") if "--" in argv else len(argv)
    head, train_args = argv[:cut], argv[cut + 1:]
    command = next((a for a in head if not a.startswith("-")), None)
    known = command in BUILTIN_COMMANDS or command in COMMAND_MODULES
    try:
        args = build_parser(command if known else None).parse_args(head)
    except flags.UsageError:
        if not known:
            raise
        args = build_parser().parse_args(head)
    if cut < len(argv):
        if not hasattr(args, "rest"):
            raise SailorError(f"sailor {command}: takes no arguments after '--' (only launch and run pass them on)")
        args.rest = [*(args.rest or []), "--", *train_args]
    return args


def _error(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    try:
        print(f"sailor: {' '.join(message.split())}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


def _stdout_gone() -> None:
    """stdout's reader left (`sailor ... | head`): send the rest nowhere, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests capture it)
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if sys.stdout is None:  # started with stdout closed (`sailor ... >&-`): what it prints goes nowhere, quietly
        sys.stdout = open(os.devnull, "w")
    try:
        args = parse(argv)
        if getattr(args, "quiet", False):
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
                return args.func(args)
        return args.func(args)
    except SailorError as e:
        _error(f"error: {e}")
        return e.exit_code
    except BrokenPipeError:  # before OSError, of which it is one
        _stdout_gone()
        return 0
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except OSError as e:  # a path the user gave that cannot be read or written
        where = f" {e.filename}" if e.filename else ""
        _error(f"error: cannot use{where}: {e.strerror or e}; check the path, its permissions and free space")
        return 2
    except Exception as e:  # noqa: BLE001 - the one place that turns a bug into one line
        if os.environ.get("SAILOR_TRACEBACK"):
            import traceback

            traceback.print_exc()
        detail = " ".join(str(e).split())
        _error(f"internal error: {type(e).__name__}: {detail[:300]}{'...' if len(detail) > 300 else ''} -- this is "
               "a bug in sailor, not a mistake in your input; please report it with the command you ran "
               "(SAILOR_TRACEBACK=1 shows where it happened)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
