"""Launch targets and Docker files, checked with the real tools' parsers where they install from PyPI."""
import json
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


def test_slurm_script_parses(tmp_path):
    script = launch(tmp_path, HETERO, "--target", "slurm")
    f = tmp_path / "job.sbatch"
    f.write_text(script)
    assert subprocess.run(["bash", "-n", str(f)]).returncode == 0
    assert script.count("#SBATCH hetjob") == 1  # V100 nodes and A100 nodes: two components
    assert "--node-rank=$(( 4 + SLURM_NODEID ))" in script  # the A100 nodes come after the 4 V100 nodes


SKYPILOT_TASK = {  # the task fields sailor writes, as SkyPilot documents them
    "type": "object", "required": ["name", "resources", "num_nodes", "run"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9-]+$"},
        "num_nodes": {"type": "integer", "minimum": 1},
        "run": {"type": "string"}, "setup": {"type": "string"},
        "envs": {"type": "object", "additionalProperties": {"type": "string"}},
        "resources": {"type": "object", "additionalProperties": False, "properties": {
            "cloud": {"type": "string"}, "zone": {"type": "string"}, "region": {"type": "string"},
            "accelerators": {"type": "string", "pattern": "^[A-Za-z0-9-]+:[0-9]+$"},
            "use_spot": {"type": "boolean"}, "image_id": {"type": "string"}}},
    },
}


def test_skypilot_tasks_validate(tmp_path):
    import jsonschema

    docs = list(yaml.safe_load_all(launch(tmp_path, HETERO, "--target", "skypilot")))
    assert [d["resources"]["accelerators"] for d in docs] == ["V100:4", "A100:4"]
    assert [d["num_nodes"] for d in docs] == [4, 2]  # 4 V100 nodes; 4 TP-2 replicas on 4-GPU A100 nodes
    for d in docs:
        jsonschema.validate(d, SKYPILOT_TASK)


@pytest.mark.parametrize("plan, elastic", [(HOMO, True), (HETERO, False)])
def test_kubernetes_pytorchjobs_validate(tmp_path, plan, elastic):
    from kubernetes import client

    api = client.ApiClient()
    jobs = list(yaml.safe_load_all(launch(tmp_path, plan, "--target", "k8s")))
    assert all(j["apiVersion"] == "kubeflow.org/v1" and j["kind"] == "PyTorchJob" for j in jobs)
    assert ("elasticPolicy" in jobs[0]["spec"]) == elastic
    replicas = 0
    for j in jobs:
        for role, spec in j["spec"]["pytorchReplicaSpecs"].items():
            assert role in ("Master", "Worker")
            pod = api._ApiClient__deserialize(spec["template"], "V1PodTemplateSpec")  # the client's own model
            assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] in ("2", "4")
            replicas += spec["replicas"]
    assert replicas == (4 if elastic else 6)  # nodes: 4 A100 (one pipeline each) | 4 V100 + 2 A100


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


@pytest.mark.skipif(shutil.which("hadolint") is None and not (Path(sys.executable).parent / "hadolint").exists(),
                    reason="hadolint is installed with the test extras")
def test_dockerfiles_lint_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    out = subprocess.run([hadolint, "Dockerfile", "Dockerfile.cpu"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("Dockerfile", "Dockerfile.cpu"):  # both install the project as the README does
        assert "bash tools/setup.sh" in (ROOT / name).read_text()
