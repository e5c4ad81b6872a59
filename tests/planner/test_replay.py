"""Trace replay: parsing, the iteration and cost arithmetic, the policies."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.errors import SailorError
from planner.replay import Snapshot, load_trace, replay
from planner.specs.hardware import Pool
from planner.specs.plan import Pipeline, Plan, Replica, Stage

ROOT = Path(__file__).resolve().parents[2]


def fake_plan(n: int, t: float):
    r = Replica("A100-40", 1, "z")
    plan = Plan("tiny", n, (Stage(0, 5, (r,) * n),), (Pipeline(1, 1),) * n)
    est = SimpleNamespace(iteration_time_s=t, compute_cost_per_iteration_usd=n * 3.6 * t / 3600,
                          egress_cost_per_iteration_usd=0.01)
    return plan, est


def plan_for(pools, homogeneous):
    n = sum(p.count for p in pools)
    return fake_plan(n, 10.0 / n) if n else None  # perfect scaling: 10 GPU-seconds per iteration


def trace(*counts, dt=100.0):
    return [Snapshot(i * dt, (Pool("A100-40", "z", c),)) for i, c in enumerate(counts)]


def test_iterations_and_cost_by_hand():
    run = replay(trace(4, 4, 2, 8), plan_for, "sailor", restart_s=20.0)
    s = run.steps
    assert [x.restarted for x in s] == [True, False, True, True]
    assert s[0].iterations == pytest.approx((100 - 20) / 2.5)  # 4 GPUs: 2.5 s per iteration
    assert s[1].iterations == pytest.approx(100 / 2.5)
    assert s[2].iterations == pytest.approx(80 / 5.0)
    assert s[3].end_s == pytest.approx(400.0)  # the last snapshot lasts the mean interval
    assert s[3].iterations == pytest.approx(80 / 1.25)
    # GPUs are paid during restarts too: 4 GPUs x 100 s x 3.6 $/h, plus egress per iteration
    assert s[0].cost_usd == pytest.approx(100 * 4 * 3.6 / 3600 + 0.01 * s[0].iterations)


def test_static_uses_the_floor_and_never_restarts():
    run = replay(trace(4, 8, 2, 8), plan_for, "static", restart_s=20.0)
    assert all(not x.restarted for x in run.steps) and {x.gpus_used for x in run.steps} == {2}
    assert run.iterations == pytest.approx(400 / 5.0)


def test_load_traces(tmp_path, sailor_data):
    csv_trace = load_trace(str(sailor_data / "configs" / "gpu_trace_heterogeneous_imbalanced.csv"))
    assert [s.gpus for s in csv_trace] == [128, 320, 512] and csv_trace[0].time_s == 0
    assert {p.gpu for p in csv_trace[0].pools} == {"A100-40", "V100-16"}
    js = load_trace(str(sailor_data / "traces" / "a100_trace_16.json"), gpu="V100")
    assert len(js) == 208 and js[0].pools[0].gpu == "V100-16"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"Time": 0}]))
    with pytest.raises(SailorError, match="missing field '\\[0\\].GPUs'"):
        load_trace(str(bad))


def test_replay_cli(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps([{"Time": 0, "GPUs": 4}, {"Time": 600, "GPUs": 8}, {"Time": 1200, "GPUs": 2}]))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "replay", str(f), "--model", "opt-125m",
                          "--json", "--plot", str(tmp_path / "r.png")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    by = {s["policy"]: s for s in d["summary"]}
    assert by["sailor"]["iterations"] >= by["static"]["iterations"] > 0
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_the_throughput_plot_reaches_the_end_of_the_trace():
    """The rate of a step holds until the next step starts; the last step's until the run ends (its
    segment was missing from the plot)."""
    from types import SimpleNamespace

    from planner.plots import replay_series

    steps = [SimpleNamespace(start_s=0.0, end_s=3600.0, iterations=360.0, cost_usd=1.0),
             SimpleNamespace(start_s=3600.0, end_s=5400.0, iterations=360.0, cost_usd=2.0)]
    t, rate, done, usd = replay_series(SimpleNamespace(steps=steps))
    assert t == [0.0, 1.0, 1.5] and rate == [0.1, 0.2, 0.2]
    assert done == [0.0, 360.0, 720.0] and usd == [0.0, 1.0, 3.0]


def test_static_floor_matches_a_direct_reference():
    """The floor per pool (built once, not per snapshot: that was quadratic) is the minimum over the trace,
    a pool missing from a snapshot counting 0 and one listed twice counting the sum."""
    trace = [Snapshot(0.0, (Pool("A100-40", "a", 4), Pool("V100-16", "b", 8))),
             Snapshot(100.0, (Pool("A100-40", "a", 2), Pool("A100-40", "a", 1), Pool("V100-16", "b", 8),
                              Pool("H100-80", "c", 2))),
             Snapshot(200.0, (Pool("A100-40", "a", 6), Pool("V100-16", "b", 5)))]
    asked = []
    run = replay(trace, lambda pools, homogeneous: asked.append(pools) or plan_for(pools, homogeneous), "static",
                 restart_s=20.0)
    keys = {(p.gpu, p.zone) for s in trace for p in s.pools}
    floor = {k: min(sum(p.count for p in s.pools if (p.gpu, p.zone) == k) for s in trace) for k in keys}
    assert len(asked) == 1 and set(asked[0]) == {Pool(g, z, n) for (g, z), n in floor.items() if n > 0}
    assert set(asked[0]) == {Pool("A100-40", "a", 3), Pool("V100-16", "b", 5)}
    assert [s.gpus_used for s in run.steps] == [8, 8, 8] and not any(s.restarted for s in run.steps)
    assert run.iterations == pytest.approx(300 / (10.0 / 8))


@pytest.mark.parametrize("text, needle", [
    (",Timestamp,CPU_local\n0,0," + "2" * 140000 + "\n", "line 2 has a field longer than 131072 characters"),
    (",Timestamp,CPU_local\n0,100,2\n1,200,2\n\n2,150,2\n", "line 5 goes back in time ('150' before '200' on line 3)"),
    (",Timestamp,CPU_local\n0,\u0663,2\n", "line 2, column Timestamp: '\u0663' is not a number"),
    (",Timestamp,CPU_local\n0,1_0,2\n", "line 2, column Timestamp: '1_0' is not a number"),
    (",Timestamp,CPU_local\n0,1,\uff12\n", "line 2, column CPU_local: '\uff12' is not a whole number"),
    (",Timestamp,CPU_local\n0,1,2_0\n", "line 2, column CPU_local: '2_0' is not a whole number"),
], ids=["big-field", "back-in-time", "arabic-digit", "underscore", "fullwidth-count", "underscore-count"])
def test_csv_trace_mistakes_name_the_line(tmp_path, text, needle):
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(SailorError) as e:
        load_trace(str(f))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_csv_trace_numbers_and_order(tmp_path):
    """Plain decimals (with a fraction, an exponent, spaces) are read; equal timestamps are in order."""
    f = tmp_path / "t.csv"
    f.write_text(",Timestamp,CPU_local\n0,1712574014.0187,2\n1, 1712574014.0187 ,4\n2,1.712574114e9,1e1\n")
    snaps = load_trace(str(f))
    assert [s.time_s for s in snaps] == pytest.approx([0.0, 0.0, 99.9813]) and [s.gpus for s in snaps] == [2, 4, 10]


@pytest.mark.parametrize("zone, ok", [("local", True), ("mars-1", False), ("", False)])
def test_a_csv_column_without_a_zone_takes_a_known_zone(tmp_path, zone, ok):
    f = tmp_path / "nz.csv"
    f.write_text(",Timestamp,CPU\n0,0,2\n")
    if ok:
        assert load_trace(str(f), zone=zone)[0].pools == (Pool("CPU", "local", 2),)
        return
    with pytest.raises(SailorError, match=f"--zone \\(the zone of column 'CPU' of trace .*\\): unknown zone '{zone}'"):
        load_trace(str(f), zone=zone)
