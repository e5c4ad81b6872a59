"""The `sailor` command: the only place in the planner that prints.

    sailor simulate PLAN --model NAME [--profiles DIR] [--cluster FILE] [--json]
    sailor plan --model NAME [--gpus TYPE@ZONE=N,...] [--global-batch N] [--objective ...] ...

Every user mistake ends in one line `sailor: error: ...` and exit code 2.
"""
from __future__ import annotations

import argparse
import json
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


def _context(args, model_name: str):
    from planner.profiles.store import load_profiles
    from planner.simulator.simulate import Simulator
    from planner.specs.hardware import load_cluster
    from planner.specs.model import get_model

    cluster = load_cluster(args.cluster)
    model = get_model(model_name)
    store = load_profiles(args.profiles, dict(cluster.gpus))
    return cluster, model, Simulator(model, cluster, store, args.precision)


# -- simulate ----------------------------------------------------------------
def cmd_simulate(args) -> int:
    from planner.simulator.runtime_model import runtime_model
    from planner.specs.plan import load_plan

    plan = load_plan(args.plan)
    _, model, sim = _context(args, args.model or plan.model)
    est = sim.simulate(plan, runtime_model(args.runtime) if args.runtime else None)
    if args.json:
        out = est.to_dict()
        out["plan"] = args.plan
        out["model"] = model.name
        out["runtime"] = args.runtime or plan.runtime
        print(json.dumps(out, indent=1))
        return 0
    from planner.report import print_estimate

    print_estimate(est, title=f"{model.name}: {Path(args.plan).name} on {plan.runtime if not args.runtime else args.runtime}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sailor", description="Plan, simulate and run transformer training on "
                                 "heterogeneous, geo-distributed GPUs.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("simulate", help="predict iteration time, memory and cost of a plan")
    p.add_argument("plan", help="plan file: ours, or Sailor's plan_config JSON (detected)")
    p.add_argument("--model", help="model preset, Sailor name or config.json (default: the plan's)")
    p.add_argument("--runtime", choices=["sailor", "megatron-deepspeed"],
                   help="framework that runs the plan (default: the plan's; Sailor-format plans: megatron-deepspeed)")
    _common(p)
    p.set_defaults(func=cmd_simulate)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except SailorError as e:
        print(f"sailor: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("sailor: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
