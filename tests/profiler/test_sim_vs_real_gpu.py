"""bench/sim_vs_real_gpu.py's whole loop (profile, plan, simulate, run) as a dry run on CPU, so that the GPU
benchmark cannot rot where CI has no GPU. Its numbers are not judged here: the CPU loop is
bench/sim_vs_real_cpu.py's, the GPU results are in docs/profiler.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys

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
