"""How long one `Simulator.simulate(plan)` takes (target: <= 1 ms median).

Plans: every validation plan and every anchor plan of sailor-data (1..64
replicas, 1..5 stages). Each is simulated `--repeat` times after a warm-up
call; prints JSON with the median per plan and overall.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.profiles.store import load_profiles  # noqa: E402
from planner.simulator.simulate import Simulator  # noqa: E402
from planner.specs.hardware import Cluster  # noqa: E402
from planner.specs.plan import load_plan, plan_model  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "sailor-data"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    data = Path(args.data)
    if not data.is_dir():
        print(json.dumps({"skipped": f"no sailor-data at {data}"}))
        return 0
    store = load_profiles([str(data)])
    cluster = Cluster()
    files = sorted((data / "validation").rglob("*.json")) + sorted((data / "anchor-plans").glob("*.json"))
    per_plan, all_times = {}, []
    for f in files:
        plan = load_plan(str(f))
        sim = Simulator(plan_model(plan), cluster, store)
        sim.simulate(plan)  # warm the profile and network caches, as a planner would have them
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            sim.simulate(plan)
            times.append(time.perf_counter() - t0)
        per_plan[f.name if f.parent.name == "anchor-plans" else str(f.relative_to(data / "validation"))] = {
            "replicas": plan.dp, "stages": plan.pp, "median_ms": round(1e3 * statistics.median(times), 4)}
        all_times.append(statistics.median(times))
    print(json.dumps({"plans": per_plan, "median_ms": round(1e3 * statistics.median(all_times), 4),
                      "max_median_ms": round(1e3 * max(all_times), 4), "target_ms": 1.0}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
