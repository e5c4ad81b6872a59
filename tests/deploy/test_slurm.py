"""sailor's Slurm batch scripts on a real Slurm cluster (slurmctld and two slurmd on this machine).

Runs where Slurm is installed and we are root (CI installs slurm-wlm); skipped elsewhere.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _slurm_cluster import Cluster, available

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


def tiny_plan(zones: list[str]) -> dict:
    """tiny (6 layers) as 4 single-GPU stages of one pipeline; stage s in zones[s]."""
    layers = [(0, 1), (2, 3), (4, 4), (5, 5)]
    return {"model": "tiny", "global_batch_size": 8,
            "stages": [{"layers": list(l), "replicas": [{"gpu": "CPU", "tp": 1, "zone": z}]}
                       for l, z in zip(layers, zones)],
            "pipelines": [{"microbatch_size": 2, "num_microbatches": 4}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    yield c
    c.stop()


def submit(cluster, workdir: Path, plan: dict, launch_args: list[str], train_args: list[str]) -> tuple[str, str, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "plan.json").write_text(json.dumps(plan))
    (workdir / "cluster.yaml").write_text("gpus:\n  CPU: {gpus_per_node: 2}\n")
    # the zones the geo plans name, declared as sailor requires (its nodes carry them as Slurm features)
    (workdir / "zones.yaml").write_text("zones:\n  local-a: {region: local}\n  local-b: {region: local}\n")
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", "plan.json", "--target", "slurm",
                          "-o", "job.sbatch", *launch_args, "--", *train_args],
                         capture_output=True, text=True, cwd=workdir, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    job = cluster.sbatch(workdir / "job.sbatch", workdir, env)
    state, code = cluster.wait_job(job, timeout=240)
    log = "\n".join(p.read_text() for p in workdir.glob("*.out"))
    return state, code, log


def test_two_node_job_trains(cluster, tmp_path):
    """Two pipelines of two stages; with 2 GPUs per node (the cluster file) each pipeline has a node."""
    plan = {"model": "tiny", "global_batch_size": 8,
            "stages": [{"layers": l, "replicas": [{"gpu": "CPU", "tp": 1, "zone": "local", "count": 2}]}
                       for l in ([0, 2], [3, 5])],
            "pipelines": [{"microbatch_size": 2, "num_microbatches": 2, "count": 2}]}
    state, code, log = submit(cluster, tmp_path, plan, ["--cluster", "cluster.yaml"],
                              ["--train-iters", "3", "--metrics-file", "metrics.jsonl"])
    assert (state, code) == ("COMPLETED", "0:0"), log[-3000:]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH hetjob" not in script and "#SBATCH --nodes=2" in script


def test_geo_plan_runs_as_a_heterogeneous_job_in_its_zones(cluster, tmp_path):
    """Stages 0-1 in zone local-a, 2-3 in local-b: two components, each on the node with its zone's feature."""
    state, code, log = submit(cluster, tmp_path, tiny_plan(["local-a", "local-a", "local-b", "local-b"]),
                              ["--cluster", "zones.yaml"], ["--train-iters", "3", "--metrics-file", "metrics.jsonl"])
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --constraint=CPU&local-a" in script and "#SBATCH --constraint=CPU&local-b" in script
    assert (state, code) == ("COMPLETED", "0:0"), log[-3000:]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_failing_ranks_fail_the_job(cluster, tmp_path):
    state, code, log = submit(cluster, tmp_path, tiny_plan(["local-a", "local-a", "local-b", "local-b"]),
                              ["--cluster", "zones.yaml"], ["--train-iters", "3", "--data-path", "no-such-dataset"])
    assert state == "FAILED" and code != "0:0", log[-3000:]
    assert "sailor: error:" in log and "no-such-dataset" in log, log[-6000:]
