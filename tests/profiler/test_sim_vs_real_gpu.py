"""bench/sim_vs_real_gpu.py: its whole loop (profile, plan, simulate, run) as a dry run on CPU, so that the GPU
benchmark cannot rot where CI has no GPU (the dry run's numbers are not judged: the CPU loop is
bench/sim_vs_real_cpu.py's); and the simulator's peak memory against the runs made on an H100."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _profiler_helpers import ROOT


def test_dry_run_on_cpu_profiles_plans_and_runs_every_plan(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sim_vs_real_gpu.py"), "--device", "cpu", "--layers", "2", "--hidden",
         "64", "--seq-length", "32", "--global-batch", "4", "--micro-batch-sizes", "1,2", "--steps", "2", "--warmup",
         "1", "--repeats", "2", "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["device"] == "cpu" and result["gpu"] == "CPU"
    plans = {row["plan"]: row for row in result["plans"]}
    # the pick, then the other microbatch size and both with recomputation: three or four plans in all
    assert "planner's pick" in plans and len(plans) >= 3, list(plans)
    for row in plans.values():
        assert "run_error" not in row, row
        assert row["predicted_step_s"] > 0 and row["measured_step_s"] > 0 and row["predicted_peak_gib"] > 0
        assert "measured_peak_gib" not in row  # the CPU keeps no peak count
    assert sum("recompute" in row["layout"] for row in plans.values()) >= 1
    assert (tmp_path / "profiles").is_dir() and (tmp_path / "plan-pick.json").is_file()


def test_peak_memory_of_the_h100_runs_from_their_profile():
    """The simulator against real GPU runs: the six plans run on one H100 (bench/results/h100-2026-11-25),
    predicted again from the profile measured there. Allocated bytes, like with like (the prediction without
    the GPU's runtime-overhead term, which torch does not count). The recomputing plans peak in the optimizer
    step (foreach AdamW's sqrt(v), 4 B/parameter); without that term they come out 5-15 % low."""
    results = ROOT / "bench" / "results" / "h100-2026-11-25"
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sim_vs_real_gpu.py"), "--gpu", "H100-80", "--profiles",
         str(results / "profiles"), "--predict-only"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    predicted = {row["plan"]: row for row in json.loads(out.stdout)["plans"]}
    measured = json.loads((results / "sim_vs_real_gpu_3_blocks_back_to_back.json").read_text())["plans"]
    assert len(measured) == len(predicted) == 6
    for run in measured:
        mine = predicted[run["plan"]]
        assert mine["layout"] == run["layout"]
        assert mine["predicted_peak_gib"] == pytest.approx(run["measured_peak_gib"], rel=0.01), run["plan"]
