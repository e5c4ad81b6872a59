"""The distributed optimizer (ZeRO-1) in plans: the plan records it, the simulator splits each stage's optimizer
state and step over its replicas, and every launch target and the runtime turn it on. (The planner's search with
it is checked against brute force in test_search.py.)"""
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.errors import SailorError
from planner.profiles.store import ProfileStore
from planner.simulator.runtime_model import runtime_model
from planner.simulator.simulate import Simulator
from planner.specs.hardware import load_cluster, parse_gpus
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage, load_plan, plan_from_dict, plan_to_dict, plan_to_sailor

ROOT = Path(__file__).resolve().parents[2]


def sailor(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def one_stage_plan(D: int, precision: str = "bf16", sharded: bool = True) -> Plan:
    reps = tuple(Replica("A100-40", 2, "us-central1-a") for _ in range(D))
    return Plan("opt-125m", 8 * D, (Stage(0, 13, reps),), (Pipeline(2, 4),) * D, precision=precision,
                distributed_optimizer=sharded)


@pytest.mark.parametrize("precision, whole", [("bf16", 18.0), ("fp32", 16.0)])
@pytest.mark.parametrize("D", [2, 4])
def test_each_replica_keeps_and_steps_its_part_of_the_optimizer_state(precision, whole, D):
    """S(D) = S - 8 (1 - 1/D) bytes per parameter (Adam's moments split D ways; bf16: 2 + 4 + 4 + 8/D), the
    optimizer step's own tensors W/D, and the step's time / D; the gradient ring moves the same bytes."""
    cluster = load_cluster(None).with_available(parse_gpus("A100-40@us-central1-a=16", load_cluster(None), "--gpus"))
    sim = Simulator(get_model("opt-125m"), cluster, ProfileStore(), precision)
    split, plain = sim.simulate(one_stage_plan(D, precision)), sim.simulate(one_stage_plan(D, precision, False))
    state = "weights, grads, optimizer"
    assert plain.stages[0].memory_parts[state] / whole == pytest.approx(
        split.stages[0].memory_parts[state] / (whole - 8 * (1 - 1 / D)), rel=1e-12)
    assert runtime_model("sailor").state_bytes(precision, D) == whole - 8 + 8 / D
    profile = sim.profile("A100-40")
    update = profile.optimizer_s_per_param * profile.layer_memory(1).stage_params(0, 13) / 2  # TP 2
    assert plain.iteration_time_s - split.iteration_time_s == pytest.approx(update * (1 - 1 / D), rel=1e-9)
    assert split.stages[0].sync_s == plain.stages[0].sync_s and split.pipeline_time_s == plain.pipeline_time_s
    assert split.peak_memory_bytes < plain.peak_memory_bytes
    deepspeed = runtime_model("megatron-deepspeed")  # `sailor simulate --runtime megatron-deepspeed`: none to split
    assert sim.simulate(one_stage_plan(D, precision), deepspeed) == sim.simulate(one_stage_plan(D, precision, False),
                                                                                 deepspeed)


def test_the_plan_records_it_in_both_formats():
    plan = one_stage_plan(2)
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert again.distributed_optimizer and again == plan
    assert "distributed_optimizer" not in plan_to_dict(replace(plan, distributed_optimizer=False))
    assert plan_from_dict(json.loads(json.dumps(plan_to_sailor(plan)))).distributed_optimizer
    with pytest.raises(SailorError, match="true or false"):
        plan_from_dict({**plan_to_dict(plan), "distributed_optimizer": "yes"})


def test_megatron_deepspeed_has_no_distributed_optimizer(tmp_path):
    with pytest.raises(SailorError, match="the distributed optimizer is sailor's runtime's"):
        replace(one_stage_plan(2), runtime="megatron-deepspeed").check()
    out = sailor("plan", "--model", "opt-125m", "--gpus", "A100-40@us-central1-a=8", "--global-batch", "32",
                 "--runtime", "megatron-deepspeed", "--use-distributed-optimizer", "-o", tmp_path / "p.json")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "sailor's runtime's" in out.stderr, out.stderr


def test_plan_simulate_and_every_launch_target_carry_it(tmp_path):
    plan_file = tmp_path / "plan.json"
    out = sailor("plan", "--model", "opt-125m", "--gpus", "A100-40@us-central1-a=8", "--global-batch", "32",
                 "--max-stages", "2", "--use-distributed-optimizer", "--json", "-o", plan_file)
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    assert planned["distributed_optimizer"] and json.loads(plan_file.read_text())["distributed_optimizer"]
    sim = sailor("simulate", plan_file, "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["iteration_time_s"] == pytest.approx(planned["iteration_time_s"], rel=1e-9)
    for target in ("torchrun", "slurm", "k8s", "skypilot", "megatron-lm"):
        launch = sailor("launch", plan_file, "--target", target, "--", "--train-iters", "5")
        assert launch.returncode == 0, launch.stderr
        assert re.search(r"--use-distributed-optimizer\b", launch.stdout), (target, launch.stdout)
    # a rank started on the plan turns it on by itself (an elastic job's workers get plans, not flags)
    from planner.launch import rank_layout
    from sailor_ext.train import parse_args, resolve_plan

    plan = load_plan(str(plan_file))
    args = parse_args(["--plan", str(plan_file), "--train-iters", "5"])
    assert not args.use_distributed_optimizer
    resolve_plan(args, rank_layout(plan, load_cluster(None)).world_size)
    assert args.use_distributed_optimizer


def test_an_elastic_job_with_it_replans_with_it():
    """`sailor run -- --use-distributed-optimizer`: the controller's plans count on it and say so, so every
    worker that takes one turns it on."""
    from planner.elastic import protocol as P
    from planner.elastic.replan import Replanner
    from planner.profiles.store import load_profiles
    from planner.search.goal import Goal

    cluster, model = load_cluster(None), get_model("tiny")
    profiles = load_profiles(None, dict(cluster.gpus), model)
    for sharded in (False, True):
        proposal = Replanner(model, cluster, profiles, 8, Goal(), distributed_optimizer=sharded).propose(
            [P.NodeInfo("a", "CPU", "local", 2)])
        assert proposal.plan.distributed_optimizer is sharded
