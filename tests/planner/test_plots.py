"""Timelines and plots."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.simulator.timeline import one_f_one_b

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("P, m", [(1, 4), (2, 8), (4, 4), (4, 16)])
def test_1f1b_makespan_for_equal_stages(P, m):
    ops = one_f_one_b([1.0] * P, [2.0] * P, [0.0] * max(P - 1, 0), m)
    assert len(ops) == 2 * P * m
    assert max(op.end for op in ops) == pytest.approx((m + P - 1) * 3.0)
    for s in range(P):  # every stage runs one op at a time, and at most P - s forwards ahead
        mine = sorted((op for op in ops if op.stage == s), key=lambda op: op.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(mine, mine[1:]))
        ahead = 0
        for op in mine:
            ahead += 1 if op.kind == "F" else -1
            assert ahead <= P - s


def test_plots_from_the_cli(tmp_path):
    plan = tmp_path / "plan.json"
    out = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "--model", "opt-125m", "--gpus",
                          "A100-40=16,V100-16=16", "-o", str(plan), "--plot", str(tmp_path / "front.png")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "planner.cli", "simulate", str(plan), "--plot", str(tmp_path / "t.svg"),
                          "--json"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    est = json.loads(out.stdout)
    parts = est["stages"][0]["memory_parts"]
    assert sum(parts.values()) == pytest.approx(est["memory_per_stage_bytes"][0])
    assert (tmp_path / "front.png").stat().st_size > 5000
    assert "<svg" in (tmp_path / "t.svg").read_text()[:2000]
