"""Launch targets and Docker files, checked with the real tools' parsers where they install from PyPI."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

HETERO = {"model": "opt-125m", "global_batch_size": 64,
          "stages": [{"layers": [0, 3], "replicas": [{"gpu": "V100-16", "tp": 4, "zone": "us-central1-a", "count": 4}]},
                     {"layers": [4, 13], "replicas": [{"gpu": "A100-40", "tp": 2, "zone": "us-central1-b", "count": 4}]}],
          "pipelines": [{"microbatch_size": 2, "num_microbatches": 8, "count": 4}]}
HOMO = {"model": "opt-125m", "global_batch_size": 64,
        "stages": [{"layers": [0, 6], "replicas": [{"gpu": "A100-40", "tp": 2, "zone": "us-central1-a", "count": 4}]},
                   {"layers": [7, 13], "replicas": [{"gpu": "A100-40", "tp": 2, "zone": "us-central1-a", "count": 4}]}],
        "pipelines": [{"microbatch_size": 2, "num_microbatches": 8, "count": 4}]}


def launch(tmp_path, plan, *args):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), *args, "--", "--train-iters", "5"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


GEO = {**HOMO, "stages": [HOMO["stages"][0], {**HOMO["stages"][1], "replicas": [
    {"gpu": "A100-40", "tp": 2, "zone": "us-west1-b", "count": 4}]}]}
SINGLE = {"model": "opt-125m", "global_batch_size": 8,
          "stages": [{"layers": [0, 13], "replicas": [{"gpu": "A100-40", "tp": 2, "zone": "us-central1-a"}]}],
          "pipelines": [{"microbatch_size": 2, "num_microbatches": 4}]}
PARTIAL = {**SINGLE, "global_batch_size": 24,  # 6 ranks on 4-GPU nodes: a node of 4 and a node of 2
           "stages": [{"layers": [0, 13], "replicas": [{"gpu": "V100-16", "tp": 2, "zone": "us-central1-a",
                                                        "count": 3}]}],
           "pipelines": [{"microbatch_size": 2, "num_microbatches": 4, "count": 3}]}
SHAPES = {"single node": SINGLE, "one group": HOMO, "partial last node": PARTIAL, "heterogeneous": HETERO,
          "geo": GEO}


def test_slurm_script_parses(tmp_path):
    script = launch(tmp_path, HETERO, "--target", "slurm")
    f = tmp_path / "job.sbatch"
    f.write_text(script)
    assert subprocess.run(["bash", "-n", str(f)]).returncode == 0
    assert script.count("#SBATCH hetjob") == 1  # V100 nodes and A100 nodes: two components
    assert "#SBATCH --constraint=V100-16&us-central1-a" in script  # GPU type and zone
    assert script.count("srun") == 1 and "--kill-on-bad-exit=1" in script and "&\n" not in script
    assert "--node-rank=$SLURM_PROCID" in script


def test_slurm_partial_last_node_starts_its_own_process_count(tmp_path):
    script = launch(tmp_path, PARTIAL, "--target", "slurm")
    assert "--nproc-per-node=$(a=(4 2); echo ${a[$SLURM_PROCID]})" in script
    assert "#SBATCH --gres=gpu:4" in script and "#SBATCH --gres=gpu:2" in script


# -- SkyPilot: the real client, in its own environment (tools/setup.sh) -----------------------------
SKY_PYTHON = ROOT / ".venv-skypilot" / "bin" / "python"
SKY_CHECK = """
import json, sys
import sky
from sky.utils import common_utils, dag_utils, schemas, yaml_utils
out = []
for path in sys.argv[1:]:
    assert not dag_utils.is_job_group_yaml(path)
    config = yaml_utils.read_yaml_all(path)
    assert len(config) == 1, "one document: sky launch takes a single task"
    common_utils.validate_schema(config[0], schemas.get_task_schema(), "Invalid task YAML: ")
    env = [("MASTER_ADDR", "10.0.0.2")] if (config[0].get("envs") or {}).get("MASTER_ADDR", "x") is None else None
    dag = dag_utils.load_chain_dag_from_yaml(path, env_overrides=env)  # what sky launch does
    assert len(dag.tasks) == 1, "YAML specifies a DAG which is only supported by sky jobs launch"
    try:
        task = sky.Task.from_yaml(path)
        needs = None
    except ValueError as e:
        needs = str(e)
        task = dag.tasks[0]
    out.append({"name": task.name, "num_nodes": task.num_nodes, "envs": dict(task.envs), "needs": needs,
                "mounts": dict(task.file_mounts or {}), "run": task.run,
                "accelerators": [dict(r.accelerators) for r in task.resources],
                "zones": [r.zone for r in task.resources]})
print(json.dumps(out))
"""


@pytest.mark.skipif(not SKY_PYTHON.exists(), reason="SkyPilot is installed by tools/setup.sh in .venv-skypilot "
                    "(its click pin conflicts with transformers' huggingface-hub)")
@pytest.mark.parametrize("shape", SHAPES)
def test_skypilot_tasks_load_in_skypilot(tmp_path, shape):
    plan = SHAPES[shape]
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), "--target", "skypilot",
                          "-o", str(tmp_path / "sky.yaml"), "--", "--train-iters", "5"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    files = sorted(tmp_path.glob("sky*.yaml"))
    checked = subprocess.run([str(SKY_PYTHON), "-c", SKY_CHECK, *map(str, files)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr[-3000:]
    tasks = json.loads(checked.stdout)
    nodes = {"single node": [1], "one group": [4], "partial last node": [1, 1], "heterogeneous": [4, 2],
             "geo": [2, 2]}[shape]
    assert [t["num_nodes"] for t in tasks] == nodes
    for i, t in enumerate(tasks):
        assert t["mounts"] == {"/tmp/sailor/plan.json": str(f)}
        assert "--plan /tmp/sailor/plan.json" in t["run"]
        if i:  # the other groups need group 0's head: sky launch refuses them without --env MASTER_ADDR
            assert "MASTER_ADDR" in t["needs"] and "--env" in t["needs"]
        else:
            assert t["needs"] is None and "SKYPILOT_NODE_IPS" in t["run"]
    if shape == "geo":
        assert [t["zones"] for t in tasks] == [["us-central1-a"], ["us-west1-b"]]
    if shape == "partial last node":
        assert [t["accelerators"] for t in tasks] == [[{"V100": 4}], [{"V100": 2}]]
    if len(tasks) > 1:
        assert "sky launch -c sailor-1" in out.stdout and "--env MASTER_ADDR=" in out.stdout


def test_skypilot_needs_an_output_file_for_several_groups(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(HETERO))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), "--target", "skypilot"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "give -o FILE.yaml" in out.stderr


# -- Kubernetes: kubeflow-training's models, kubernetes-validate, the operator's webhook rules --------
def strict(value, model: str, path: str = "$"):
    """Walk `value` (a manifest dict) through kubeflow-training's OpenAPI models; unknown fields fail."""
    import kubeflow.training.models as models

    if model.startswith("list["):
        assert isinstance(value, list), path
        for i, v in enumerate(value):
            strict(v, model[5:-1], f"{path}[{i}]")
        return
    if model.startswith("dict("):
        assert isinstance(value, dict), path
        inner = model[model.index(",") + 1:-1].strip()
        for k, v in value.items():
            strict(v, inner, f"{path}.{k}")
        return
    if model in ("str", "int", "bool", "float", "object"):
        types = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}[model]
        assert isinstance(value, types) and not (model == "int" and isinstance(value, bool)), (path, value, model)
        return
    cls = getattr(models, model, None)
    if cls is None:  # a Kubernetes core type: checked by kubernetes-validate on the pod template
        import kubernetes.client.models as core

        cls = getattr(core, model)
    by_json = {v: k for k, v in cls.attribute_map.items()}
    assert isinstance(value, dict), path
    for key, v in value.items():
        assert key in by_json, f"{path}.{key}: not a field of {model}"
        strict(v, cls.openapi_types[by_json[key]], f"{path}.{key}")


def webhook(job: dict) -> list[str]:
    """The training operator's admission rules for a PyTorchJob (pkg/webhooks/pytorch in kubeflow/training-operator)."""
    errors = []
    name = job["metadata"]["name"]
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        errors.append("metadata.name: not a DNS-1035 label")
    spec = job["spec"]
    specs = spec.get("pytorchReplicaSpecs") or {}
    if not specs:
        errors.append("pytorchReplicaSpecs: must be required")
    if "elasticPolicy" in spec:
        if "Worker" not in specs:
            errors.append("Worker: must be configured if elastic policy is used")
        if "nProcPerNode" in spec["elasticPolicy"]:
            errors.append("elasticPolicy.nProcPerNode is deprecated, use nprocPerNode")
    for role, r in specs.items():
        if role not in ("Master", "Worker"):
            errors.append(f"{role}: not a PyTorchJob replica type")
        containers = r["template"]["spec"].get("containers") or []
        if not any(c.get("name") == "pytorch" for c in containers) or any(not c.get("image") for c in containers):
            errors.append(f"{role}: needs a container named pytorch with an image")
        if role == "Master" and r.get("replicas") != 1:
            errors.append("Master.replicas: must be 1")
        if role == "Worker" and r.get("replicas", 1) < 1:
            errors.append("Worker.replicas: must be at least 1")
    return errors


@pytest.mark.parametrize("shape", SHAPES)
def test_kubernetes_manifests_validate(tmp_path, shape):
    import kubernetes_validate

    plan = SHAPES[shape]
    docs = list(yaml.safe_load_all(launch(tmp_path, plan, "--target", "k8s")))
    files, jobs = docs[0], docs[1:]
    kubernetes_validate.validate(files, "1.33", strict=True)
    assert files["kind"] == "ConfigMap" and json.loads(files["data"]["plan.json"]) == plan
    nodes = []
    for job in jobs:
        assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
        strict(job, "KubeflowOrgV1PyTorchJob")
        assert webhook(job) == [], webhook(job)
        for role, spec in job["spec"]["pytorchReplicaSpecs"].items():
            template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                        "template": spec["template"]}
            kubernetes_validate.validate(template, "1.33", strict=True)
            pod = spec["template"]["spec"]
            assert pod["volumes"][0]["configMap"]["name"] == files["metadata"]["name"]
            run = pod["containers"][0]["command"][2]
            assert "--plan /etc/sailor/plan.json" in run
            nproc = int(re.search(r"--nproc-per-node=(\d+)", run).group(1))
            assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == str(nproc)
            assert job["spec"]["nprocPerNode"] == str(nproc)
            nodes += [nproc] * spec["replicas"]
    expect = {"single node": [2], "one group": [4] * 4, "partial last node": [4, 2], "heterogeneous": [4] * 6,
              "geo": [4] * 4}[shape]
    assert sorted(nodes) == sorted(expect)  # every node starts its own rank count: 6 ranks start 6
    assert ("elasticPolicy" in jobs[0]["spec"]) == (len(jobs) == 1)
    masters = sum("Master" in j["spec"]["pytorchReplicaSpecs"] for j in jobs)
    assert masters == (0 if len(jobs) == 1 else 1)


def test_megatron_lm_args_for_homogeneous_plans_only(tmp_path):
    text = launch(tmp_path, HOMO, "--target", "megatron-lm")
    assert "--tensor-model-parallel-size 2" in text and "--pipeline-model-parallel-size 2" in text
    assert "--micro-batch-size 2" in text and "--global-batch-size 64" in text
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(HETERO))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), "--target", "megatron-lm"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "no Megatron-LM equivalent" in out.stderr
    assert "--recompute" not in text
    recomputing = {**HOMO, "stages": [{**st, "recompute": True} for st in HOMO["stages"]]}
    assert "--recompute-granularity full" in launch(tmp_path, recomputing, "--target", "megatron-lm")
    partly = {**HOMO, "stages": [{**HOMO["stages"][0], "recompute": True}, *HOMO["stages"][1:]]}
    f.write_text(json.dumps(partly))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), "--target", "megatron-lm"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "some stages only" in out.stderr


def _with_model(tmp_path, plan: dict, cfg: dict) -> dict:
    """`plan` for the model of a Hugging Face config: the plan carries it (model_config)."""
    from planner.specs.model import get_model

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path / "config.json"), seq_len=1024)
    last = spec.num_layers - 1
    stages = [{**plan["stages"][0], "layers": [0, last // 2]}, {**plan["stages"][1], "layers": [last // 2 + 1, last]}]
    return {**plan, "model": spec.name, "seq_length": 1024, "stages": stages, "model_config": spec.to_dict()}


def test_megatron_lm_args_follow_the_plans_model(tmp_path):
    llama = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
             "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
             "rope_theta": 500000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False}
    text = launch(tmp_path, _with_model(tmp_path, HOMO, llama), "--target", "megatron-lm")
    for arg in ("--num-layers 4", "--seq-length 1024", "--max-position-embeddings 4096", "--normalization RMSNorm",
                "--norm-epsilon 1e-06", "--swiglu", "--position-embedding-type rope", "--rotary-base 500000",
                "--group-query-attention", "--num-query-groups 2", "--disable-bias-linear",
                "--untie-embeddings-and-output-weights"):
        assert arg in text, arg
    # InternLM3's dynamic NTK scaling keeps the default frequencies inside the context (1024 of 4096 here)
    internlm3 = {**llama, "model_type": "internlm3", "rope_scaling": {"rope_type": "dynamic", "factor": 6.0}}
    text = launch(tmp_path, _with_model(tmp_path, HOMO, internlm3), "--target", "megatron-lm")
    assert "--rotary-base 500000" in text and "scaling" not in text
    opt_350m = {"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
                "ffn_dim": 4096, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
                "do_layer_norm_before": False}
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(_with_model(tmp_path, HOMO, opt_350m)))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), "--target", "megatron-lm"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "cannot express" in out.stderr and "post-LN" in out.stderr
    # sailor's runtime takes what Megatron-LM cannot
    torchrun = launch(tmp_path, _with_model(tmp_path, HOMO, opt_350m), "--target", "torchrun")
    assert "-m sailor_ext.train --plan" in torchrun and "--train-iters 5" in torchrun
    # a layer Megatron-LM's arguments would build differently is refused, never dropped
    for name, cfg, what in (
            ("gemma", {"model_type": "gemma"}, "norms that scale by (1 + w)"),
            ("qwen3", {"model_type": "qwen3", "head_dim": 64}, "per-head q/k norms"),
            ("hunyuan", {"model_type": "hunyuan_v1_dense"}, "q/k norms after the rotary positions"),
            ("pythia", {"model_type": "gpt_neox", "rotary_pct": 0.25, "use_parallel_residual": False},
             "rotary positions on 0.25 of each head"),
            ("gpt-oss", {"model_type": "gpt_oss", "head_dim": 64, "num_local_experts": 4,
                         "layer_types": ["full_attention"] * 4, "rope_parameters": {"rope_type": "default"}},
             "attention sinks")):
        model_dir = tmp_path / name
        model_dir.mkdir()
        plan = _with_model(model_dir, HOMO, {**llama, **cfg})
        f.write_text(json.dumps(plan))
        out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), "--target", "megatron-lm"],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2 and f"uses {what}, which stock Megatron-LM's arguments cannot express" in \
            out.stderr, out.stderr


@pytest.mark.skipif(shutil.which("hadolint") is None and not (Path(sys.executable).parent / "hadolint").exists(),
                    reason="hadolint is installed with the test extras")
def test_dockerfiles_lint_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    out = subprocess.run([hadolint, "Dockerfile", "Dockerfile.cpu"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("Dockerfile", "Dockerfile.cpu"):  # both install the project as the README does
        assert "bash tools/setup.sh" in (ROOT / name).read_text()


@pytest.mark.parametrize("schedule", [
    [],  # constant
    ["--lr-decay-style", "cosine", "--lr-decay-iters", "0"],  # sailor: no decay after the warm-up
    ["--lr-decay-style", "cosine", "--lr-warmup-iters", "10"],  # a warm-up past the last step
    ["--lr-decay-style", "cosine", "--lr-decay-iters", "4"],
    ["--lr-decay-style", "linear", "--lr-decay-iters", "6", "--min-lr", "1e-4"],
])
def test_megatron_lm_lr_schedule_is_sailors_in_megatrons_scheduler(tmp_path, schedule):
    """The learning-rate flags of `--target megatron-lm` build megatron-core's own OptimizerParamScheduler (whose
    asserts reject a decay of 0 iterations, or one not after the warm-up), and without a warm-up it gives
    sailor's learning rate at every step (sailor_ext.optimizer; with one, Megatron's warm-up starts from 0
    a step earlier)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from sailor_ext.optimizer import OptimizerConfig

    (tmp_path / "plan.json").write_text(json.dumps(HOMO))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(tmp_path / "plan.json"), "--target",
                          "megatron-lm", "--", "--train-iters", "6", *schedule], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    script = out.stdout
    flags = dict(re.findall(r"--(lr-decay-style|lr-decay-iters|lr-warmup-iters|min-lr|lr) (\S+)", script))
    iters, gbs = 6, HOMO["global_batch_size"]
    warmup = int(flags.get("lr-warmup-iters", 0))

    class Optimizer:
        param_groups = [{}]

    megatron = OptimizerParamScheduler(
        Optimizer(), init_lr=0.0, max_lr=float(flags["lr"]), min_lr=float(flags["min-lr"]),
        lr_warmup_steps=warmup * gbs, lr_decay_steps=int(flags.get("lr-decay-iters", iters)) * gbs,
        lr_decay_style=flags["lr-decay-style"], start_wd=0.01, end_wd=0.01, wd_incr_steps=iters * gbs,
        wd_incr_style="constant")
    args = dict(zip(schedule[::2], schedule[1::2]))
    ours = OptimizerConfig(lr=1e-3, min_lr=float(args.get("--min-lr", 0.0)), warmup_iters=warmup,
                           decay_iters=int(args.get("--lr-decay-iters", 0)),
                           decay_style=args.get("--lr-decay-style", "constant"))
    if not warmup:
        for step in range(iters):
            megatron.num_steps = step * gbs
            assert megatron.get_lr(megatron.optimizer.param_groups[0]) == pytest.approx(ours.lr_at(step)), step


@pytest.mark.parametrize("evaluation, expected", [
    ([], "--eval-iters 0"),  # sailor validates only when asked
    (["--eval-interval", "2"], "--eval-interval 2 --eval-iters 100"),  # sailor's default count
    (["--eval-interval", "2", "--eval-iters", "0"], "--eval-interval 2 --eval-iters 0"),
    (["--eval-iters", "5"], "--eval-interval 7 --eval-iters 5"),  # once, after the last step
])
def test_megatron_lm_validates_when_sailor_would(tmp_path, evaluation, expected):
    from planner.targets.megatron_lm import EVAL_ITERS
    from sailor_ext.data import EVAL_ITERS as SAILOR_EVAL_ITERS

    assert EVAL_ITERS == SAILOR_EVAL_ITERS
    (tmp_path / "plan.json").write_text(json.dumps(HOMO))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(tmp_path / "plan.json"), "--target",
                          "megatron-lm", "--", "--train-iters", "6", *evaluation], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert " ".join(re.findall(r"--eval-(?:interval|iters) \d+", out.stdout)) == expected
