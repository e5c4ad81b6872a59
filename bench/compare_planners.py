"""Our planner against the baseline planners and Sailor's own picks, judged by our simulator.

Reproduces the comparisons of the Sailor paper (SOSP'25) with our simulator
as the common judge (runtime model "sailor" for every plan):

  (a) homogeneous A100-40 clusters, 32-512 GPUs, OPT-350 and GPT-Neo-2.7;
  (b) heterogeneous A100-40 + V100-16 in one zone, balanced and imbalanced
      (the imbalanced counts are the rows of configs/gpu_trace_heterogeneous_imbalanced.csv);
  (c) geo-distributed A100-40 over 2-5 zones of us-central1 and us-west1, and
      what going geo-distributed buys against mixing GPU types in one zone;
  (c') a few GPUs of two types over three zones (A100-40 in two, V100-16 in a
      third or in one of them), larger models, batch 64;
  (d) min cost per iteration under a throughput floor (0.2 iterations/s), and
      max throughput under a budget (USD per iteration);
  (e) search time against GPU count and number of GPU types.

For every planner and case: iteration time, throughput, USD per iteration, and
whether the plan fits in memory under our simulator (out-of-memory plans are
counted as failures, as the paper counts them). Where sailor-data has an
anchor plan for the same case (the rival Sailor planner's pick), it is
simulated too. Baselines plan for exactly the GPUs they are given; in (d)
they are also given a user's sweep of smaller allocations (see SWEEP_SCALES).

    python bench/compare_planners.py [--data ../shared/sailor-data] [--out out/compare] [--quick]

Prints JSON; writes results.json, tables.md and PNG plots into --out.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.baselines import BASELINES, run_baseline  # noqa: E402
from planner.errors import SailorError  # noqa: E402
from planner.profiles.store import load_profiles  # noqa: E402
from planner.search.goal import Goal  # noqa: E402
from planner.search.planner import Planner  # noqa: E402
from planner.simulator.runtime_model import runtime_model  # noqa: E402
from planner.simulator.simulate import Simulator  # noqa: E402
from planner.specs.hardware import GIB, Cluster, Pool, canonical_gpu  # noqa: E402
from planner.specs.model import canonical_name, get_model  # noqa: E402
from planner.specs.plan import plan_from_sailor  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "sailor-data"
RUNTIME = "sailor"
OPT, NEO = ("OPT-350", 1024), ("GPT-Neo-2.7", 2048)  # model, global batch (Sailor's training configs)
A100, V100 = "A100-40", "V100-16"
CENTRAL = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
WEST = "us-west1-b"
THROUGHPUT_FLOOR = 0.2  # iterations/s, the paper's cost experiment
BUDGET_USD_PER_ITERATION = 0.35
SWEEP_SCALES = (1, 2, 4, 8, 16)  # a user's sweep: every pool divided by these
HET_BASELINES = ("amp", "metis", "flashflex")  # the paper's heterogeneous comparison


# -- running one case -----------------------------------------------------------
class Bench:
    def __init__(self, data: Path):
        self.data = data
        self.stores: dict = {}
        self.rt = runtime_model(RUNTIME)
        self.anchors = self._anchors()

    def simulator(self, model_name: str, pools: list[tuple[str, str, int]]) -> Simulator:
        model = get_model(model_name)
        if model.name not in self.stores:
            self.stores[model.name] = load_profiles([str(self.data)], model=model.name)
        cluster = Cluster().with_available(tuple(Pool(g, z, n) for g, z, n in pools))
        return Simulator(model, cluster, self.stores[model.name])

    def _anchors(self) -> dict:
        out = {}
        for f in sorted((self.data / "anchor-plans").glob("*.json")):
            d = json.loads(f.read_text())
            case = d["case"]
            pools = {}
            for key, n in case["cluster"].items():
                gpu, zone = key.split("_", 1)
                pools[f"{canonical_gpu(gpu) or gpu}@{zone}"] = int(n)
            key = (canonical_name(case["model"]), int(case["global_batch_size"]), case["objective"] == "iteration_cost",
                   case.get("min_throughput") or None, tuple(sorted(pools.items())))
            out[key] = (f.stem, plan_from_sailor(d, f.name, canonical_name(case["model"])))
        return out

    def anchor(self, sim: Simulator, gbs: int, cost: bool, floor: float | None):
        pools = {}
        for p in sim.cluster.available:
            pools[f"{p.gpu}@{p.zone}"] = pools.get(f"{p.gpu}@{p.zone}", 0) + p.count
        return self.anchors.get((sim.model.name, gbs, cost, floor, tuple(sorted(pools.items()))))

    def judge(self, sim: Simulator, plan, predicted: float | None, search_s: float | None) -> dict:
        est = sim.simulate(plan, self.rt)
        tps = sorted({r.tp for s in plan.stages for r in s.replicas})
        return {
            "iteration_time_s": round(est.iteration_time_s, 4),
            "throughput_iters_per_s": round(est.throughput_iters_per_s, 5),
            "cost_per_iteration_usd": round(est.cost_per_iteration_usd, 4),
            "fits_in_memory": est.fits_in_memory,
            "peak_memory_gib": round(est.peak_memory_bytes / GIB, 2),
            "gpus_used": plan.num_gpus, "gpus": est.gpus_used, "stages": plan.pp, "pipelines": plan.dp, "tp": tps,
            "microbatch_size": sorted({p.microbatch_size for p in plan.pipelines}),
            "layers": [[s.first, s.last] for s in plan.stages],
            **({"predicted_iteration_time_s": round(predicted, 4)} if predicted is not None else {}),
            **({"search_time_s": round(search_s, 4)} if search_s is not None else {}),
        }

    def sailor(self, sim: Simulator, gbs: int, goal: Goal) -> dict:
        try:
            result = Planner(sim, gbs, goal, RUNTIME).run(top=1)
        except SailorError as e:
            return {"error": str(e)}
        if not result.plans:
            return {"error": "no plan meets the goal", "search_time_s": round(result.search_time_s, 4)}
        plan, est = result.plans[0]
        return self.judge(sim, plan, est.iteration_time_s, result.search_time_s)

    def baseline(self, name: str, sim: Simulator, gbs: int) -> dict:
        t0 = time.process_time()
        try:
            r = run_baseline(name, sim, gbs, RUNTIME)
        except SailorError as e:
            return {"error": str(e), "search_time_s": round(time.process_time() - t0, 4)}
        return self.judge(sim, r.plan, r.predicted_iteration_time_s, r.search_time_s)

    def case(self, name: str, model: str, gbs: int, pools, baselines=tuple(BASELINES)) -> dict:
        sim = self.simulator(model, pools)
        planners = {"sailor": self.sailor(sim, gbs, Goal("throughput"))}
        anchor = self.anchor(sim, gbs, False, None)
        if anchor:
            planners["sailor-paper"] = {"anchor": anchor[0], **self.judge(sim, anchor[1], None, None)}
        for b in baselines:
            planners[b] = self.baseline(b, sim, gbs)
        row = {"case": name, "model": sim.model.name, "global_batch": gbs,
               "cluster": {f"{g}@{z}": n for g, z, n in pools}, "planners": planners}
        row["speedup_of_sailor"] = speedups(planners)
        log(f"{name}: " + ", ".join(f"{k} {v.get('throughput_iters_per_s', 'err')}"
                                    f"{'' if v.get('fits_in_memory', True) else ' OOM'}" for k, v in planners.items()))
        return row


def speedups(planners: dict) -> dict:
    """Sailor's throughput over each other planner's; 'OOM' / 'no plan' where that planner failed."""
    ours = planners["sailor"].get("throughput_iters_per_s")
    out = {}
    for k, v in planners.items():
        if k == "sailor" or ours is None:
            continue
        if "error" in v:
            out[k] = "no plan"
        elif not v["fits_in_memory"]:
            out[k] = "OOM"
        else:
            out[k] = round(ours / v["throughput_iters_per_s"], 3)
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the experiments ------------------------------------------------------------
def homogeneous(bench: Bench, quick: bool) -> list[dict]:
    rows = []
    for (model, gbs), sizes in ((OPT, (32, 512) if quick else (32, 64, 128, 256, 512)),
                                (NEO, (128,) if quick else (32, 64, 128, 256, 512))):
        for n in sizes:
            rows.append(bench.case(f"{model} homo N{n}", model, gbs, [(A100, CENTRAL[0], n)]))
    return rows


def imbalanced_counts(data: Path) -> list[tuple[int, int]]:
    """(A100, V100) counts of the rows of Sailor's imbalanced heterogeneous trace."""
    with open(data / "configs" / "gpu_trace_heterogeneous_imbalanced.csv") as f:
        reader = csv.DictReader(f)
        a_col = next(c for c in reader.fieldnames if c.startswith(A100))
        v_col = next(c for c in reader.fieldnames if c.startswith(V100))
        return [(int(float(r[a_col])), int(float(r[v_col]))) for r in reader]


def heterogeneous(bench: Bench, quick: bool) -> list[dict]:
    zone = CENTRAL[0]
    cases = [(OPT, (n, n), "balanced") for n in ((64,) if quick else (16, 64, 256))]
    cases += [(OPT, c, "imbalanced") for c in imbalanced_counts(bench.data)[: 1 if quick else None]]
    if not quick:
        cases += [(NEO, (64, 64), "balanced"), (NEO, imbalanced_counts(bench.data)[0], "imbalanced")]
    rows = []
    for (model, gbs), (a, v), kind in cases:
        rows.append(bench.case(f"{model} {kind} {a}xA100+{v}xV100", model, gbs, [(A100, zone, a), (V100, zone, v)]))
        rows[-1]["kind"] = kind
    return rows


GEO_CASES = [  # name, zones, A100-40 per zone
    ("2 zones", CENTRAL[:2], 64), ("2 zones", CENTRAL[:2], 256), ("3 zones", CENTRAL[:3], 128),
    ("4 zones", CENTRAL, 32), ("4 zones", CENTRAL, 128), ("5 zones", CENTRAL + [WEST], 128),
    ("2 regions", [CENTRAL[0], WEST], 64), ("2 regions", [CENTRAL[0], WEST], 256),
]


def geo(bench: Bench, quick: bool) -> list[dict]:
    model, gbs = OPT
    rows = []
    for name, zones, per_zone in (GEO_CASES[:1] + GEO_CASES[4:5] if quick else GEO_CASES):
        rows.append(bench.case(f"{name} {len(zones) * per_zone}xA100", model, gbs,
                               [(A100, z, per_zone) for z in zones]))
    return rows


MIXED_CASES = [  # model, global batch, pools: a few GPUs of two types over three pools
    ("GPT-Neo-2.7", 64, [(A100, CENTRAL[0], 4), (A100, WEST, 4), (V100, CENTRAL[0], 8)]),
    ("OPT-1.3b", 64, [(A100, CENTRAL[0], 4), (A100, CENTRAL[1], 4), (V100, CENTRAL[2], 8)]),
    ("LLaMA-3-8", 64, [(A100, CENTRAL[0], 4), (A100, CENTRAL[1], 4), (V100, CENTRAL[2], 8)]),
]


def mixed(bench: Bench, quick: bool) -> list[dict]:
    rows = []
    for model, gbs, pools in MIXED_CASES[:1] if quick else MIXED_CASES:
        name = f"{model} " + " + ".join(f"{n}x{g}@{z}" for g, z, n in pools)
        rows.append(bench.case(name, model, gbs, pools))
    return rows


def geo_vs_het(bench: Bench, quick: bool) -> list[dict]:
    """Sailor with N/2 more GPUs: V100s in the same zone, or A100s in another zone / region."""
    model, gbs = OPT
    a, b, w = CENTRAL[0], CENTRAL[1], WEST
    rows = []
    for half in ((64,) if quick else (64, 256)):
        options = {
            f"{half}xA100 one zone": [(A100, a, half)],
            f"+{half}xV100 same zone": [(A100, a, half), (V100, a, half)],
            f"+{half}xA100 another zone": [(A100, a, half), (A100, b, half)],
            f"+{half}xA100 another region": [(A100, a, half), (A100, w, half)],
        }
        out = {}
        for label, pools in options.items():
            out[label] = bench.sailor(bench.simulator(model, pools), gbs, Goal("throughput"))
        het = out[f"+{half}xV100 same zone"]["throughput_iters_per_s"]
        row = {"base_a100": half, "sailor": out,
               "geo_zone_over_het": round(out[f"+{half}xA100 another zone"]["throughput_iters_per_s"] / het, 3),
               "geo_region_over_het": round(out[f"+{half}xA100 another region"]["throughput_iters_per_s"] / het, 3)}
        log(f"geo vs het, {half} A100 + {half}: zone/het {row['geo_zone_over_het']}, "
            f"region/het {row['geo_region_over_het']}")
        rows.append(row)
    return rows


COST_CASES = [
    ("128xA100, one zone", OPT, [(A100, CENTRAL[0], 128)]),
    ("A100+V100 in 2 zones (fig. 11)", OPT, [(A100, CENTRAL[0], 128), (A100, CENTRAL[1], 128),
                                             (V100, CENTRAL[0], 128), (V100, CENTRAL[1], 128)]),
]


def sweep(pools, scales) -> list[list[tuple[str, str, int]]]:
    """A user's allocations: all pools, one GPU type's pools, or a single pool, each divided by a scale."""
    types = sorted({g for g, _, _ in pools})
    subsets = [pools]
    if len(types) > 1:
        subsets += [[p for p in pools if p[0] == t] for t in types]
    if len(pools) > 1:
        subsets += [[p] for p in pools]
    out = []
    for subset in subsets:
        for s in scales:
            alloc = [(g, z, n // s) for g, z, n in subset if n // s > 0]
            if alloc and alloc not in out:
                out.append(alloc)
    return out


def cost(bench: Bench, quick: bool) -> list[dict]:
    """Min cost under the throughput floor, max throughput under the budget."""
    rows = []
    for name, (model, gbs), pools in COST_CASES[:1] if quick else COST_CASES:
        sim = bench.simulator(model, pools)
        row = {"case": name, "model": sim.model.name, "global_batch": gbs,
               "cluster": {f"{g}@{z}": n for g, z, n in pools}, "throughput_floor": THROUGHPUT_FLOOR,
               "budget_usd_per_iteration": BUDGET_USD_PER_ITERATION}
        row["sailor_min_cost"] = bench.sailor(sim, gbs, Goal("cost", min_throughput=THROUGHPUT_FLOOR))
        row["sailor_max_throughput"] = bench.sailor(sim, gbs, Goal("throughput",
                                                                   max_cost_per_iteration=BUDGET_USD_PER_ITERATION))
        anchor = bench.anchor(sim, gbs, True, THROUGHPUT_FLOOR)
        if anchor:
            row["sailor_paper_min_cost"] = {"anchor": anchor[0], **bench.judge(sim, anchor[1], None, None)}
        allocations = sweep(pools, (1, 4) if quick else SWEEP_SCALES)
        runs = {b: [] for b in BASELINES}
        for alloc in allocations:
            sub = bench.simulator(model, alloc)
            for b in BASELINES:
                runs[b].append({"allocation": {f"{g}@{z}": n for g, z, n in alloc}, **bench.baseline(b, sub, gbs)})
        row["baselines_as_given"] = {b: runs[b][0] for b in BASELINES}
        row["baselines_best_of_sweep"] = {}
        for b in BASELINES:
            ok = [r for r in runs[b] if "error" not in r and r["fits_in_memory"]]
            floor = [r for r in ok if r["throughput_iters_per_s"] >= THROUGHPUT_FLOOR]
            budget = [r for r in ok if r["cost_per_iteration_usd"] <= BUDGET_USD_PER_ITERATION]
            row["baselines_best_of_sweep"][b] = {
                "min_cost": min(floor, key=lambda r: r["cost_per_iteration_usd"]) if floor else None,
                "max_throughput": max(budget, key=lambda r: r["throughput_iters_per_s"]) if budget else None,
            }
        row["allocations_swept"] = len(allocations)
        row["summary"] = cost_summary(row)
        log(f"cost {name}: {json.dumps(row['summary'])}")
        rows.append(row)
    return rows


def cost_summary(row: dict) -> dict:
    """Sailor's cost against the cheapest baseline that meets the floor, and its throughput against the
    fastest baseline within the budget (as given, and best of the sweep)."""
    out = {}
    ours = row["sailor_min_cost"].get("cost_per_iteration_usd")
    fast = row["sailor_max_throughput"].get("throughput_iters_per_s")
    given = [(b, r) for b, r in row["baselines_as_given"].items() if "error" not in r and r["fits_in_memory"]]
    meets = [(b, r) for b, r in given if r["throughput_iters_per_s"] >= THROUGHPUT_FLOOR]
    within = [(b, r) for b, r in given if r["cost_per_iteration_usd"] <= BUDGET_USD_PER_ITERATION]
    swept = [(b, v["min_cost"]) for b, v in row["baselines_best_of_sweep"].items() if v["min_cost"]]
    swept_fast = [(b, v["max_throughput"]) for b, v in row["baselines_best_of_sweep"].items() if v["max_throughput"]]
    if ours and meets:
        b, r = min(meets, key=lambda x: x[1]["cost_per_iteration_usd"])
        out["as_given_next_best"] = b
        out["as_given_cost_reduction"] = round(1 - ours / r["cost_per_iteration_usd"], 3)
    if ours and swept:
        b, r = min(swept, key=lambda x: x[1]["cost_per_iteration_usd"])
        out["sweep_next_best"] = b
        out["sweep_cost_reduction"] = round(1 - ours / r["cost_per_iteration_usd"], 3)
    if fast and within:
        b, r = max(within, key=lambda x: x[1]["throughput_iters_per_s"])
        out["budget_as_given_best"] = b
        out["budget_as_given_speedup"] = round(fast / r["throughput_iters_per_s"], 3)
    if fast and swept_fast:
        b, r = max(swept_fast, key=lambda x: x[1]["throughput_iters_per_s"])
        out["budget_sweep_best"] = b
        out["budget_sweep_speedup"] = round(fast / r["throughput_iters_per_s"], 3)
    out["baselines_meeting_floor_as_given"] = [b for b, _ in meets]
    out["baselines_within_budget_as_given"] = [b for b, _ in within]
    return out


TYPES = [A100, V100, "A100-80", "GH200-96", "RTX-3090"]


def search_time(bench: Bench, quick: bool, homo_rows: list[dict]) -> dict:
    """CPU seconds of every planner's search: against GPU count (from (a)), and against GPU types."""
    by_gpus = []
    for row in homo_rows:
        if row["model"] == get_model(OPT[0]).name:
            by_gpus.append({"gpus": sum(row["cluster"].values()), **_search_seconds(row)})
    by_types = []
    model, gbs = OPT
    for k in range(1, (2 if quick else len(TYPES)) + 1):
        pools = [(t, CENTRAL[0], 256 // k) for t in TYPES[:k]]
        row = bench.case(f"{k} GPU types, 256 GPUs", model, gbs, pools)
        by_types.append({"types": k, **_search_seconds(row)})
    return {"by_gpus": by_gpus, "by_types": by_types}


def _search_seconds(row: dict) -> dict:
    """Search CPU seconds of the planners that found a plan (None for those that found none)."""
    return {k: None if "error" in v else v.get("search_time_s") for k, v in row["planners"].items()
            if k != "sailor-paper"}


# -- headline numbers ---------------------------------------------------------------
def ratio_range(rows: list[dict], names) -> dict:
    out = {}
    for n in names:
        vals = [r["speedup_of_sailor"][n] for r in rows if n in r["speedup_of_sailor"]]
        nums = [v for v in vals if isinstance(v, (int, float))]
        out[n] = {"min": min(nums) if nums else None, "max": max(nums) if nums else None,
                  "oom": sum(v == "OOM" for v in vals), "no_plan": sum(v == "no plan" for v in vals),
                  "cases": len(vals)}
    return out


def worst_ratio(results: dict) -> dict:
    """Our throughput over each rival's fitting pick, unrounded, at its lowest over every case of (a)-(c):
    below 1 a rival's pick beats ours under our own simulator."""
    worst = None
    for key in ("homogeneous", "heterogeneous", "geo", "mixed"):
        for row in results.get(key, ()):
            ours = row["planners"]["sailor"].get("throughput_iters_per_s")
            for name, v in row["planners"].items():
                if name == "sailor" or ours is None or "error" in v or not v["fits_in_memory"]:
                    continue
                ratio = ours / v["throughput_iters_per_s"]
                if worst is None or ratio < worst["ratio"]:
                    worst = {"ratio": ratio, "case": row["case"], "planner": name}
    if worst is not None:
        worst["beaten"] = worst["ratio"] < 1 - 1e-9
    return worst or {}


def headline(results: dict) -> dict:
    h = {"worst_ratio": worst_ratio(results)}
    if "homogeneous" in results:
        h["homogeneous_speedup"] = ratio_range(results["homogeneous"], list(BASELINES) + ["sailor-paper"])
    if "heterogeneous" in results:
        opt = [r for r in results["heterogeneous"] if r["model"] == get_model(OPT[0]).name]
        h["heterogeneous_opt350_speedup"] = ratio_range(opt, list(BASELINES) + ["sailor-paper"])
    if "geo" in results:
        h["geo_speedup"] = ratio_range(results["geo"], list(BASELINES) + ["sailor-paper"])
    if "mixed" in results:
        h["mixed_speedup"] = ratio_range(results["mixed"], list(BASELINES))
    if "geo_vs_het" in results:
        h["geo_over_het"] = [{"base_a100": r["base_a100"], "zone": r["geo_zone_over_het"],
                              "region": r["geo_region_over_het"]} for r in results["geo_vs_het"]]
    if "cost" in results:
        h["cost"] = {r["case"]: r["summary"] for r in results["cost"]}
    if "search_time" in results:
        h["sailor_search_s_by_gpus"] = {r["gpus"]: r["sailor"] for r in results["search_time"]["by_gpus"]}
        h["sailor_search_s_by_types"] = {r["types"]: r["sailor"] for r in results["search_time"]["by_types"]}
    return h


# -- markdown tables (docs/evaluation.md is written from these) -------------------------
COLUMNS = ["sailor", "sailor-paper", *BASELINES]


def _cell(v: dict | None) -> str:
    if not v:
        return ""
    if "error" in v:
        return "no plan"
    text = f"{v['throughput_iters_per_s']:.3f} (${v['cost_per_iteration_usd']:.2f})"
    return text if v["fits_in_memory"] else f"OOM [{text}]"


def _cost_cells(cheapest: dict | None, fastest: dict | None) -> str:
    """min cost | its it/s | max it/s | its cost; 'none' where no plan meets the goal."""
    def ok(v):
        return v is not None and "error" not in v

    left = f"{cheapest['cost_per_iteration_usd']:.3f} | {cheapest['throughput_iters_per_s']:.3f}" if ok(cheapest) \
        else "none | "
    right = f"{fastest['throughput_iters_per_s']:.3f} | {fastest['cost_per_iteration_usd']:.3f}" if ok(fastest) \
        else ("none | " if fastest is not None else " | ")
    return f"{left} | {right}"


def tables_markdown(results: dict) -> str:
    """Every case as a row: throughput in iterations/s (USD per iteration); OOM = out of memory."""
    out = []
    for key in ("homogeneous", "heterogeneous", "geo", "mixed"):
        if key not in results:
            continue
        rows = results[key]
        cols = [c for c in COLUMNS if any(c in r["planners"] for r in rows)]
        out += [f"### {key}", "", "| case | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        out += ["| " + r["case"] + " | " + " | ".join(_cell(r["planners"].get(c)) for c in cols) + " |" for r in rows]
        out.append("")
    if "geo_vs_het" in results:
        out += ["### geo_vs_het (sailor)", "", "| A100 | option | it/s | $/iteration | GPUs used |",
                "|---|---|---|---|---|"]
        for r in results["geo_vs_het"]:
            for label, v in r["sailor"].items():
                out.append(f"| {r['base_a100']} | {label} | {v['throughput_iters_per_s']:.3f} | "
                           f"{v['cost_per_iteration_usd']:.3f} | {v['gpus_used']} |")
        out.append("")
    if "cost" in results:
        out += ["### cost", "", "| case | planner | min $/it at >= floor | it/s | max it/s within budget | $/it |",
                "|---|---|---|---|---|---|"]
        for r in results["cost"]:
            out.append(f"| {r['case']} | sailor | {_cost_cells(r['sailor_min_cost'], r['sailor_max_throughput'])} |")
            if "sailor_paper_min_cost" in r:
                out.append(f"| | Sailor's pick | {_cost_cells(r['sailor_paper_min_cost'], None)} |")
            for b in BASELINES:
                g, best = r["baselines_as_given"][b], r["baselines_best_of_sweep"][b]
                given = "no plan" if "error" in g else (
                    f"{g['cost_per_iteration_usd']:.3f} at {g['throughput_iters_per_s']:.3f} it/s"
                    + ("" if g["fits_in_memory"] else " OOM"))
                out.append(f"| | {b} (as given: {given}) | {_cost_cells(best['min_cost'], best['max_throughput'])} |")
        out.append("")
    if "search_time" in results:
        st = results["search_time"]
        names = ["sailor", *BASELINES]
        for key, label in (("by_gpus", "GPUs"), ("by_types", "GPU types")):
            out += [f"### search CPU seconds by {label}", "", f"| {label} | " + " | ".join(names) + " |",
                    "|---" * (len(names) + 1) + "|"]
            for r in st[key]:
                cells = [("no plan" if r.get(n) is None else f"{r[n]:.3f}") for n in names]
                out.append(f"| {r['gpus' if key == 'by_gpus' else 'types']} | " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--out", default="out/compare", help="folder for results.json and the PNG plots")
    ap.add_argument("--quick", action="store_true", help="a few cases of each experiment (about a minute)")
    ap.add_argument("--only", default="", help="comma-separated experiments: homogeneous, heterogeneous, geo, "
                                               "mixed, geo_vs_het, cost, search_time")
    args = ap.parse_args()
    data = Path(args.data)
    if not (data / "anchor-plans").is_dir():
        print(json.dumps({"skipped": f"no sailor-data at {data}"}))
        return 0
    experiments = ("homogeneous", "heterogeneous", "geo", "mixed", "geo_vs_het", "cost", "search_time")
    wanted = set(filter(None, args.only.split(","))) or set(experiments)
    unknown = wanted - set(experiments)
    if unknown:
        print(f"compare_planners: unknown experiment {', '.join(sorted(unknown))}; use {', '.join(experiments)}",
              file=sys.stderr)
        return 2
    bench = Bench(data)
    t0 = time.perf_counter()
    results: dict = {}
    if "homogeneous" in wanted or "search_time" in wanted:
        results["homogeneous"] = homogeneous(bench, args.quick)
    if "heterogeneous" in wanted:
        results["heterogeneous"] = heterogeneous(bench, args.quick)
    if "geo" in wanted:
        results["geo"] = geo(bench, args.quick)
    if "mixed" in wanted:
        results["mixed"] = mixed(bench, args.quick)
    if "geo_vs_het" in wanted:
        results["geo_vs_het"] = geo_vs_het(bench, args.quick)
    if "cost" in wanted:
        results["cost"] = cost(bench, args.quick)
    if "search_time" in wanted:
        results["search_time"] = search_time(bench, args.quick, results["homogeneous"])
    out = {"runtime": RUNTIME, "quick": args.quick, "wall_s": round(time.perf_counter() - t0, 1),
           "headline": headline(results), "results": results}
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    (folder / "tables.md").write_text(tables_markdown(results) + "\n")
    from compare_plots import plot_all  # matplotlib only when plotting

    out["plots"] = plot_all(results, folder)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
