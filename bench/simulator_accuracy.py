"""Simulator accuracy on the measured runs published with Sailor.

For every plan in sailor-data/validation: predicted vs measured iteration time
(`real`) and peak memory (`max_mem`), per row and as mean absolute percentage
error per set (GH200 = clariden/, RTX mix = mit/). Prints JSON.

    python bench/simulator_accuracy.py [--data ../shared/sailor-data] [--calibration]

--calibration adds, for rows with data parallelism, what the measured
`red_grads` (rank 0's gradient-reduction call, so a rank of stage 0) is made
of: the modelled ring all-reduce of stage 0, and how long a replica of stage 0
can wait in it for the slowest pipeline (the spread of the pipelines' times;
0 when all replicas are alike). A rank measures the ring plus its own wait:
red_grads lies between the ring and the ring plus that spread if the model is
right.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.profiles.store import load_profiles  # noqa: E402
from planner.simulator.simulate import Simulator  # noqa: E402
from planner.specs.hardware import Cluster  # noqa: E402
from planner.specs.plan import load_plan, plan_model  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "sailor-data"


def rows(data: Path, calibration: bool = False) -> list[dict]:
    store = load_profiles([str(data)])
    cluster = Cluster()
    sims: dict[str, Simulator] = {}
    out = []
    for f in sorted((data / "validation").rglob("plan_config_*.json")):
        plan = load_plan(str(f))
        # Sailor's runs were fp32 (Megatron-DeepSpeed, fp32 weights): its files read as fp32 plans
        assert plan.precision == "fp32", f"{f}: read as a {plan.precision} plan"
        sim = sims.setdefault((plan.model, plan.precision), Simulator(plan_model(plan), cluster, store, plan.precision))
        est = sim.simulate(plan)
        real, mem = plan.notes["real"], plan.notes["max_mem"]
        row = {
            "case": str(f.relative_to(data / "validation")),
            "set": "GH200" if "clariden" in f.parts else "RTX",
            "pp": plan.pp, "dp": plan.dp, "mbs": plan.pipelines[0].microbatch_size,
            "real_s": real, "predicted_s": round(est.iteration_time_s, 4),
            "time_error_pct": round(100 * (est.iteration_time_s - real) / real, 2),
            "real_mem_gb": round(mem / 1e9, 3), "predicted_mem_gb": round(est.peak_memory_bytes / 1e9, 3),
            "mem_error_pct": round(100 * (est.peak_memory_bytes - mem) / mem, 2),
        }
        if calibration and plan.dp > 1:
            t_pp = sim.pipeline_times(plan)
            ring, wait = est.stages[0].sync_s, max(t_pp) - min(t_pp)
            red = plan.notes.get("red_grads")
            row["red_grads_s"] = red
            row["modelled_allreduce_s"] = round(ring, 4)
            row["modelled_straggler_wait_s"] = round(wait, 4)
            if red:
                row["red_grads_over_allreduce"] = round(red / ring, 2)
                row["red_grads_over_allreduce_plus_wait"] = round(red / (ring + wait), 2)
        out.append(row)
    return out


def summary(table: list[dict]) -> dict:
    res = {}
    for name in ("GH200", "RTX"):
        sel = [r for r in table if r["set"] == name]
        if sel:
            res[name] = {
                "rows": len(sel),
                "time_mape_pct": round(statistics.fmean(abs(r["time_error_pct"]) for r in sel), 2),
                "memory_mape_pct": round(statistics.fmean(abs(r["mem_error_pct"]) for r in sel), 2),
            }
    res["targets"] = {"GH200": "time <= 5 %, memory <= 5 %", "RTX": "<= 10 %"}
    res["sailor_simulator"] = {"GH200": {"time_mape_pct": 8.9, "memory_mape_pct": 5.9},
                               "RTX": {"time_mape_pct": 10.3, "memory_mape_pct": 76}}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--calibration", action="store_true")
    args = ap.parse_args()
    data = Path(args.data)
    if not (data / "validation").is_dir():
        print(json.dumps({"skipped": f"no sailor-data at {data}"}))
        return 0
    table = rows(data, args.calibration)
    print(json.dumps({"rows": table, "summary": summary(table)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
