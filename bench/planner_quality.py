"""Our planner's picks against Sailor's, both judged by our simulator (JSON out).

For every case in sailor-data/anchor-plans (the cluster, model, batch and
objective Sailor's planner was given, and the plan it picked), run our planner
on the same inputs and simulate both plans with the same runtime model.
Throughput cases compare iteration time; cost cases compare dollars per
iteration under the same throughput floor.

    python bench/planner_quality.py [--data ../shared/sailor-data] [--runtime sailor]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.profiles.store import load_profiles  # noqa: E402
from planner.search.goal import Goal  # noqa: E402
from planner.search.planner import Planner  # noqa: E402
from planner.simulator.runtime_model import runtime_model  # noqa: E402
from planner.simulator.simulate import Simulator  # noqa: E402
from planner.specs.hardware import Cluster, Pool, canonical_gpu  # noqa: E402
from planner.specs.model import get_model  # noqa: E402
from planner.specs.plan import plan_from_sailor  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "sailor-data"


def case_cluster(spec: dict) -> Cluster:
    pools = []
    for key, n in spec.items():
        gpu, zone = key.split("_", 1)
        pools.append(Pool(canonical_gpu(gpu) or gpu, zone, int(n)))
    return Cluster().with_available(tuple(pools))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--runtime", default="sailor", choices=["sailor", "megatron-deepspeed"])
    args = ap.parse_args()
    data = Path(args.data)
    if not (data / "anchor-plans").is_dir():
        print(json.dumps({"skipped": f"no sailor-data at {data}"}))
        return 0
    rt = runtime_model(args.runtime)
    rows = []
    for f in sorted((data / "anchor-plans").glob("*.json")):
        d = json.loads(f.read_text())
        case = d["case"]
        model = get_model(case["model"])
        cluster = case_cluster(case["cluster"])
        sim = Simulator(model, cluster, load_profiles([str(data)], model=model.name))
        cost = case["objective"] == "iteration_cost"
        goal = Goal("cost" if cost else "throughput", min_throughput=case.get("min_throughput") or None)
        sailor = plan_from_sailor(d, f.name, model.name)
        theirs = sim.simulate(sailor, rt)
        t0 = time.process_time()
        result = Planner(sim, case["global_batch_size"], goal, args.runtime).run(top=1)
        search = time.process_time() - t0
        plan, ours = result.plans[0]
        row = {
            "case": f.stem, "model": model.name, "gpus_available": sum(p.count for p in cluster.available),
            "objective": goal.objective, "min_throughput": goal.min_throughput,
            "ours": {"iteration_time_s": round(ours.iteration_time_s, 4), "cost_per_iteration_usd":
                     round(ours.cost_per_iteration_usd, 4), "gpus": ours.gpus_used, "stages": plan.pp,
                     "replicas": plan.dp, "tp": sorted({r.tp for s in plan.stages for r in s.replicas}),
                     "microbatch_size": plan.pipelines[0].microbatch_size},
            "sailor_pick": {"iteration_time_s": round(theirs.iteration_time_s, 4),
                            "cost_per_iteration_usd": round(theirs.cost_per_iteration_usd, 4),
                            "gpus": theirs.gpus_used, "fits_in_memory": theirs.fits_in_memory,
                            "meets_floor": goal.min_throughput is None
                            or theirs.throughput_iters_per_s >= goal.min_throughput},
            "search_s": round(search, 3),
        }
        if cost:
            row["cost_ratio_sailor_over_ours"] = round(theirs.cost_per_iteration_usd / ours.cost_per_iteration_usd, 3)
            row["ours_at_least_as_good"] = ours.cost_per_iteration_usd <= theirs.cost_per_iteration_usd * (1 + 1e-9) \
                or not row["sailor_pick"]["meets_floor"]
        else:
            row["speedup_over_sailor"] = round(theirs.iteration_time_s / ours.iteration_time_s, 3)
            row["ours_at_least_as_good"] = ours.iteration_time_s <= theirs.iteration_time_s * (1 + 1e-9) \
                or not theirs.fits_in_memory
        rows.append(row)
    print(json.dumps({"runtime": args.runtime, "cases": rows,
                      "all_at_least_as_good": all(r["ours_at_least_as_good"] for r in rows)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
