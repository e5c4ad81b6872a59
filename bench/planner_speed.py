"""CPU time and peak memory of whole `sailor plan` processes (JSON out).

Each case runs `sailor plan ... --json` as a child process once to warm up, then
`--repeat` times, and reports the median of its user+system CPU seconds and its peak RSS, next to
the search time of Sailor's own C++ planner on the same case (measured by the
issue's authors on this kind of machine; its setup adds 11-13 s), and a large
case: 16,368 GPUs of six types in eight zones (target 2 CPU-s, 300 MB). Then
the same for growing clusters (32..2048 GPUs) and for 1..5 GPU types. Before and after the cases it
times a fixed pure-Python workload the same way (reference_cpu_s): the machine's speed on the day.

    python bench/planner_speed.py [--data ../shared/sailor-data] [--repeat 3] [--quick] [--precision P]

--precision passes sailor plan's flag (default: none, so the planner's default: bf16 on
A100s, fp16 where V100s are offered; Sailor's own searches were fp32).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "sailor-data"
ZONES4 = ",".join(f"A100-40@us-central1-{z}=128" for z in "abcf")
CASES = [  # name, model, gbs, gpus, Sailor search seconds, our target
    ("512 x A100-40, one zone", "OPT-350", 1024, "A100-40@us-central1-a=512", 0.34, 0.3),
    ("256 A100-40 + 256 V100-16, one zone", "OPT-350", 1024,
     "A100-40@us-central1-a=256,V100-16@us-central1-a=256", 5.7, 1.0),
    ("512 x A100-40 over 4 zones of us-central1", "OPT-350", 1024, ZONES4, 0.27, 0.3),
    ("GPT-Neo-2.7, 64 A100-40 + 64 V100-16", "GPT-Neo-2.7", 2048,
     "A100-40@us-central1-a=64,V100-16@us-central1-a=64", 2.6, 0.5),
]
TYPES = ["A100-40", "V100-16", "A100-80", "GH200-96", "RTX-3090"]
# 16,368 GPUs: 341 of each of six types in each of eight zones (48 pools); OPT-350 at global batch 4096
ZONES8 = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-a", "us-west1-b",
          "us-east1-b", "us-east1-c"]
LARGE = ("16,368 GPUs: 6 types x 8 zones x 341", "OPT-350", 4096,
         ",".join(f"{t}@{z}=341" for t in ("A100-40", "A100-80", "V100-16", "H100-80", "L4", "T4") for z in ZONES8),
         None, 2.0)
LARGE_RSS_MB = 300


PRECISION: list[str] = []  # sailor plan's --precision, if given
# As a user's shell runs it: Python caches compiled modules (some sandboxes turn that off, and then
# every run compiles the planner's changed modules again, ~0.05 CPU-s); the first run writes the cache.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_plan(model: str, gbs: int, gpus: str, data: str) -> dict:
    """One `sailor plan` process: its CPU seconds, peak RSS and answer."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "planner.cli", "plan", "--model", model, "--global-batch", str(gbs),
               "--gpus", gpus, "--profiles", data, "--json", "-o", os.path.join(tmp, "plan.json"), "--top", "1",
               *PRECISION]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    answer = json.loads(out.stdout)
    return {"cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "peak_rss_mb": after.ru_maxrss / 1024, "search_s": answer["search_time_s"],
            "iteration_time_s": answer["iteration_time_s"]}


# A fixed pure-Python workload, timed as a whole process next to the cases: this VM's speed varies 1.5-2x
# from hour to hour, and the targets are absolute, so a reader can tell a slow machine from a slow planner.
REFERENCE = "sum(i * i % 7 for i in range(2_000_000))"


def reference_cpu_s(repeat: int) -> float:
    """Median CPU seconds of a Python process running REFERENCE."""
    runs = []
    for _ in range(repeat + 1):  # (the first warms up)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", REFERENCE], check=True, env=ENV)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return round(statistics.median(runs[1:]), 3)


def measure(model, gbs, gpus, data, repeat) -> dict:
    run_plan(model, gbs, gpus, data)  # warm-up: compiled modules cached, files in the page cache
    runs = [run_plan(model, gbs, gpus, data) for _ in range(repeat)]
    return {"cpu_s_median": round(statistics.median(r["cpu_s"] for r in runs), 3),
            "search_s_median": round(statistics.median(r["search_s"] for r in runs), 3),
            "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
            "iteration_time_s": round(runs[0]["iteration_time_s"], 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="only the target cases")
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help="sailor plan's --precision")
    args = ap.parse_args()
    if args.precision:
        PRECISION[:] = ["--precision", args.precision]
    if not Path(args.data).is_dir():
        print(json.dumps({"skipped": f"no sailor-data at {args.data}"}))
        return 0
    out: dict = {"precision": args.precision or "the planner's default",
                 "reference_cpu_s": reference_cpu_s(args.repeat), "reference": REFERENCE, "cases": []}
    for name, model, gbs, gpus, sailor_s, target in CASES:
        r = measure(model, gbs, gpus, args.data, args.repeat)
        out["cases"].append({"case": name, **r, "sailor_search_s": sailor_s, "target_s": target,
                             "meets_target": r["cpu_s_median"] <= target})
    name, model, gbs, gpus, _, target = LARGE
    r = measure(model, gbs, gpus, args.data, args.repeat)
    out["large"] = {"case": name, **r, "target_s": target, "target_rss_mb": LARGE_RSS_MB,
                    "meets_target": r["cpu_s_median"] <= target and r["peak_rss_mb"] <= LARGE_RSS_MB}
    if not args.quick:
        out["scaling_gpus"] = [{"gpus": n, **measure("OPT-350", 1024, f"A100-40@us-central1-a={n}", args.data,
                                                       args.repeat)} for n in (32, 64, 128, 256, 512, 1024, 2048)]
        out["scaling_types"] = []
        for k in range(1, len(TYPES) + 1):
            gpus = ",".join(f"{t}@us-central1-a={256 // k}" for t in TYPES[:k])
            out["scaling_types"].append({"types": k, "gpus": gpus, **measure("OPT-350", 1024, gpus, args.data,
                                                                            args.repeat)})
    out["reference_cpu_s_after"] = reference_cpu_s(args.repeat)  # (the machine may change speed meanwhile)
    out["python_startup_note"] = "cpu_s includes interpreter start, imports and reading the profiles"
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
