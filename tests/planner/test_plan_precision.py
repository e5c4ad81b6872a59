"""A plan's precision: the default follows the target, the plan records it, simulate models it, every launch
target passes it to the runtime, and profiles measured in another precision are converted, not mis-applied."""
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.errors import SailorError
from planner.profiles.estimate import estimate_profile
from planner.simulator.simulate import Simulator
from planner.specs.hardware import CATALOG, Cluster
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage, load_plan, plan_from_dict, plan_to_dict, plan_to_sailor
from planner.specs.precision import check_precision, default_precision, launch_flags

ROOT = Path(__file__).resolve().parents[2]


def sailor(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_default_precision_follows_the_target():
    gpu = CATALOG.__getitem__
    assert default_precision([gpu("A100-40"), gpu("H100-80")]) == "bf16"
    assert default_precision([gpu("A100-40"), gpu("V100-16")]) == "fp16"  # one precision per run
    assert default_precision([gpu("T4")]) == "fp16" and default_precision([gpu("CPU")]) == "fp32"
    with pytest.raises(SailorError, match="V100-16 cannot run bf16; use fp16"):
        check_precision("bf16", [gpu("A100-40"), gpu("V100-16")])
    with pytest.raises(SailorError, match="unknown precision 'fp8'"):
        check_precision("fp8")


def _train_precision(train_args: list[str], plan_path: Path) -> str:
    """The precision sailor_ext.train runs on CUDA with these arguments (parsing only, no torch)."""
    from sailor_ext.precision import precision_config
    from sailor_ext.train import follow_plan_precision, parse_args

    args = parse_args(train_args)
    follow_plan_precision(args, load_plan(str(plan_path)))
    return precision_config(args, cuda=True).name


@pytest.mark.parametrize("gpus, flags, expect", [
    ("A100-40@us-central1-a=8", [], "bf16"),
    ("V100-16@us-central1-a=8", [], "fp16"),
    ("A100-40@us-central1-a=8", ["--precision", "fp32"], "fp32"),
])
def test_plan_precision_round_trips_to_every_launch_target(tmp_path, gpus, flags, expect):
    plan_file = tmp_path / "plan.json"
    out = sailor("plan", "--model", "opt-125m", "--gpus", gpus, "--global-batch", "32", "--max-stages", "2", *flags,
                 "--json", "-o", plan_file)
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    assert planned["precision"] == expect and json.loads(plan_file.read_text())["precision"] == expect
    sim = sailor("simulate", plan_file, "--json")
    assert sim.returncode == 0, sim.stderr
    simulated = json.loads(sim.stdout)
    assert simulated["precision"] == expect
    assert simulated["iteration_time_s"] == pytest.approx(planned["iteration_time_s"], rel=1e-9)
    flag = {"fp32": "--no-bf16", "bf16": "--bf16", "fp16": "--fp16"}[expect]
    for target in ("torchrun", "slurm", "k8s", "skypilot"):
        launch = sailor("launch", plan_file, "--target", target, "--", "--train-iters", "5")
        assert launch.returncode == 0, launch.stderr
        # what every node runs after `-m sailor_ext.train` (YAML for k8s and SkyPilot): the plan's flag only
        passed = {t for t in re.findall(r"--[a-z0-9-]+", launch.stdout.split("sailor_ext.train", 1)[1])
                  if t in ("--bf16", "--no-bf16", "--fp16")}
        assert passed == {flag}, (target, launch.stdout)
        assert _train_precision([flag, "--train-iters", "5"], plan_file) == expect, target
    megatron = sailor("launch", plan_file, "--target", "megatron-lm", "--", "--train-iters", "5")
    assert megatron.returncode == 0, megatron.stderr
    said = {f for f in ("--bf16", "--fp16") if f"  {f} " in megatron.stdout or f"  {f}\n" in megatron.stdout}
    assert said == ({"--bf16"} if expect == "bf16" else {"--fp16"} if expect == "fp16" else set())
    # Sailor's format holds it too (a field Sailor ignores)
    exported = tmp_path / "sailor.json"
    out = sailor("plan", "--model", "opt-125m", "--gpus", gpus, "--global-batch", "32", "--max-stages", "2", *flags,
                 "--format", "sailor", "--recompute", "never", "-o", exported)
    assert out.returncode == 0, out.stderr
    assert json.loads(exported.read_text())["precision"] == expect and load_plan(str(exported)).precision == expect


@pytest.mark.parametrize("objective, expect", [("throughput", "fp16"), ("cost", "bf16")])
def test_the_default_precision_follows_each_plans_own_gpus(tmp_path, objective, expect):
    """V100s offered beside A100s: the fastest plan uses both and trains in fp16; the cheapest uses the A100s
    only and trains in bf16 (not in fp16 because a V100 was offered). Every listed plan takes its own GPUs'
    default, the plan file records the best's, and simulate predicts what plan printed."""
    plan_file = tmp_path / "plan.json"
    out = sailor("plan", "--model", "opt-350m", "--gpus", "A100-40@us-central1-a=2,V100-16@us-central1-a=16",
                 "--global-batch", "256", "--max-stages", "4", "--objective", objective, "--pareto", "--json",
                 "-o", plan_file)
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    assert planned["precision"] == expect == json.loads(plan_file.read_text())["precision"]
    listed = planned["top"] + planned["pareto"]
    assert {p["precision"] for p in listed} == {"bf16", "fp16"}  # both kinds of plan are listed
    for p in listed:
        assert p["precision"] == ("fp16" if any(k.startswith("V100") for k in p["gpus_used"]) else "bf16"), p
    sim = sailor("simulate", plan_file, "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["precision"] == expect
    assert json.loads(sim.stdout)["iteration_time_s"] == pytest.approx(planned["iteration_time_s"], rel=1e-9)
    table = sailor("plan", "--model", "opt-350m", "--gpus", "A100-40@us-central1-a=2,V100-16@us-central1-a=16",
                   "--global-batch", "256", "--max-stages", "4", "--objective", objective, "--pareto",
                   "-o", tmp_path / "again.json")
    assert table.returncode == 0, table.stderr
    said = re.search(r"^precision: (.*)$", table.stdout, re.M)
    assert said and "bf16" in said.group(1) and "fp16" in said.group(1), table.stdout


def test_contradicting_precision_is_one_line(tmp_path):
    plan_file = tmp_path / "plan.json"
    assert sailor("plan", "--model", "opt-125m", "--gpus", "V100-16@us-central1-a=4", "--global-batch", "8",
                  "-o", plan_file).returncode == 0
    for out, fragment in ((sailor("simulate", plan_file, "--precision", "bf16"), "contradicts the plan"),
                          (sailor("launch", plan_file, "--target", "slurm", "--", "--train-iters", "5", "--bf16"),
                           "the plan trains in fp16 but the training arguments ask for bf16"),
                          (sailor("plan", "--model", "opt-125m", "--gpus", "V100-16@us-central1-a=4", "--global-batch",
                                  "8", "--precision", "bf16", "-o", tmp_path / "x.json"), "V100-16 cannot run bf16")):
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and fragment in out.stderr, out.stderr
    with pytest.raises(SailorError, match="the plan trains in fp16 but the flags ask for fp32"):
        _train_precision(["--train-iters", "1", "--no-bf16"], plan_file)
    assert launch_flags(None, ["--train-iters", "1"]) == ["--train-iters", "1"]  # older plans: the runtime's default


def test_sailor_files_are_fp32_plans(sailor_data):
    """Sailor's measured runs were fp32; its files read as fp32 plans, and ours keep what they record."""
    f = next((sailor_data / "validation").rglob("plan_config_*.json"))
    plan = load_plan(str(f))
    assert plan.precision == "fp32"
    assert plan_from_dict(plan_to_sailor(plan)).precision == "fp32"
    ours = plan_to_dict(replace(plan, precision=None, notes={}))
    assert "precision" not in ours and plan_from_dict(ours).precision is None
    assert plan_from_dict({**ours, "precision": "bf16"}).precision == "bf16"


def test_fp32_profiles_are_converted_for_16_bit_plans(sailor_store):
    """Sailor's fp32 profile of OPT-350 on A100-40, used by a bf16 plan: activations (and what crosses a stage
    boundary) take half the bytes, parameters stay, every layer is faster by the estimator's ratio; the state
    per parameter grows from 16 to 18 bytes (fp32 master weights); the plan is faster and needs less memory."""
    model, gpu = get_model("opt-350m"), CATALOG["A100-40"]
    fp32, bf16 = sailor_store.get(model, gpu, "fp32"), sailor_store.get(model, gpu, "bf16")
    assert fp32.precision == "fp32" and bf16.precision == "bf16" and bf16.meta["converted_from"] == "fp32"
    m32, m16 = fp32.layer_memory(1), bf16.layer_memory(1)
    assert m16.params == m32.params
    assert m16.activation_bytes == pytest.approx([a / 2 for a in m32.activation_bytes])
    assert m16.output_bytes == pytest.approx([a / 2 for a in m32.output_bytes])
    est32, est16 = estimate_profile(model, gpu, "fp32"), estimate_profile(model, gpu, "bf16")
    t32, t16 = fp32.layer_times(4, 1), bf16.layer_times(4, 1)
    for layer in (0, 1, model.num_layers - 1):
        ratio = est16.layer_times(4, 1).bwd[layer] / est32.layer_times(4, 1).bwd[layer]
        assert t16.bwd[layer] == pytest.approx(t32.bwd[layer] * ratio) and ratio < 1
    # a GPU without a measured profile: estimated times, measured (fp32) memory facts converted the same way
    h100 = sailor_store.get(model, CATALOG["H100-80"], "bf16")
    assert h100.layer_memory(1).activation_bytes == pytest.approx(m16.activation_bytes)
    plan = Plan("opt-350m", 64, (Stage(0, 12, (Replica("A100-40", 1, "us-central1-a"),)),
                                 Stage(13, model.num_layers - 1, (Replica("A100-40", 1, "us-central1-a"),))),
                (Pipeline(4, 16),))
    e32 = Simulator(model, Cluster(), sailor_store, "fp32").simulate(plan)
    e16 = Simulator(model, Cluster(), sailor_store, "bf16").simulate(replace(plan, precision="bf16"))
    s32, s16 = (e.stages[0].memory_parts for e in (e32, e16))
    assert s16["weights, grads, optimizer"] == pytest.approx(s32["weights, grads, optimizer"] * 18 / 16)
    assert s16["activations"] == pytest.approx(s32["activations"] / 2)
    assert e16.iteration_time_s < 0.8 * e32.iteration_time_s
    with pytest.raises(SailorError, match="the plan trains in bf16 but this simulator models fp32"):
        Simulator(model, Cluster(), sailor_store, "fp32").simulate(replace(plan, precision="bf16"))
