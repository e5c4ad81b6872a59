"""The `sailor` command: JSON output and one-line errors with exit code 2."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sailor(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, cwd=cwd)


def write_plan(tmp_path, **over):
    plan = {"model": "tiny", "global_batch_size": 8,
            "stages": [{"layers": [0, 2], "replicas": [{"gpu": "A100-40", "tp": 1, "zone": "us-central1-a"}]},
                       {"layers": [3, 5], "replicas": [{"gpu": "V100-16", "tp": 1, "zone": "us-central1-a"}]}],
            "pipelines": [{"microbatch_size": 2, "num_microbatches": 4}]}
    plan.update(over)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    return f


def test_simulate_own_plan_without_profiles(tmp_path):
    out = sailor("simulate", str(write_plan(tmp_path)), "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["iteration_time_s"] > 0 and d["sources"]["profile tiny on A100-40"] == "estimated"
    table = sailor("simulate", str(write_plan(tmp_path)))
    assert table.returncode == 0 and "iteration time" in table.stdout


@pytest.mark.parametrize("change, message", [
    ({"stages": [{"layers": [0, 2], "replicas": [{"gpu": "B300", "tp": 1}]},
                 {"layers": [3, 5], "replicas": [{"gpu": "V100-16", "tp": 1}]}]}, "unknown GPU type 'B300'"),
    ({"stages": [{"layers": [0, 1], "replicas": [{"gpu": "A100-40", "tp": 1}]},
                 {"layers": [3, 5], "replicas": [{"gpu": "V100-16", "tp": 1}]}]}, "a gap"),
    ({"stages": [{"layers": [0, 5], "replicas": [{"gpu": "V100-16", "tp": 8}]}]}, "keep TP inside a node"),
    ({"model": "gpt-9"}, "unknown model 'gpt-9'"),
    ({"pipelines": [{"microbatch_size": 2}]}, "missing field 'num_microbatches'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, change, message):
    out = sailor("simulate", str(write_plan(tmp_path, **change)))
    assert out.returncode == 2
    assert out.stdout == "" and out.stderr.count("\n") == 1 and message in out.stderr
    assert out.stderr.startswith("sailor: error: ")


def test_not_json_and_missing_file(tmp_path):
    f = tmp_path / "p.json"
    f.write_text("{nope")
    out = sailor("simulate", str(f))
    assert out.returncode == 2 and "not valid JSON" in out.stderr
    out = sailor("simulate", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "not found" in out.stderr


def test_missing_microbatch_in_measured_profile(sailor_data, tmp_path):
    f = write_plan(tmp_path, model="opt-350m", global_batch_size=12,
                   stages=[{"layers": [0, 25], "replicas": [{"gpu": "V100-16", "tp": 1}]}],
                   pipelines=[{"microbatch_size": 3, "num_microbatches": 4}])
    out = sailor("simulate", str(f), "--profiles", str(sailor_data))
    assert out.returncode == 2 and "no microbatch size 3 at TP 1" in out.stderr
