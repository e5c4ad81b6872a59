"""`sailor launch --target megatron-lm` against Megatron-LM's own argument parser.

The parser is megatron/training/arguments.py from the megatron-core 0.19.2 wheel (the first wheels that
ship it), downloaded at test time and unpacked beside, never over, our megatron-core 0.16.1; the test is
skipped where PyPI cannot be reached. Stubbed, because they need a GPU: the MoE paged-stash module (Triton
kernels, imported on the way) and get_device_arch_version() (reported as 8, an A100). Python 3.11 gets
typing.override from typing_extensions (the wheel declares Python 3.12).
"""
import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_targets import HOMO, ROOT, _with_model

WHEEL = "megatron-core==0.19.2"


@pytest.fixture(scope="module")
def megatron_src(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("megatron")
    out = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                          "--python-version", "3.12", "--only-binary=:all:", WHEEL, "-d", str(where)],
                         capture_output=True, text=True, timeout=300)
    wheels = list(where.glob("megatron_core-*.whl"))
    if out.returncode or not wheels:
        pytest.skip(f"cannot download {WHEEL} ({out.stderr.strip().splitlines()[-1:]})")
    src = where / "src"
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(src)
    assert (src / "megatron" / "training" / "arguments.py").exists()
    return src


CHECK = r"""
import json, os, sys, types, typing
src, argv, env = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, src)
import torch
if not hasattr(typing, "override"):
    import typing_extensions
    typing.override = typing_extensions.override
class Kernels(types.ModuleType):  # Triton kernels of the MoE paged stash: GPU only
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None
sys.modules["megatron.core.transformer.moe.ops.paged_stash"] = Kernels("paged_stash")
os.environ.update(env)
import megatron.training.arguments as A
assert A.__file__.startswith(src), A.__file__
A.get_device_arch_version = lambda: 8  # an A100: no GPU here
sys.argv = ["pretrain_gpt.py", *argv]
args = A.parse_args(ignore_unknown_args=False)
A.validate_args(args, {})
if args.pipeline_model_parallel_layout:
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    PipelineParallelLayerLayout(args.pipeline_model_parallel_layout,
                                args.pipeline_model_parallel_size).validate_layer_layout(args.num_layers, None)
keys = ("data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers",
        "micro_batch_size", "global_batch_size", "train_iters", "lr", "swiglu", "normalization",
        "position_embedding_type", "group_query_attention", "num_query_groups", "add_bias_linear",
        "rotary_base", "untie_embeddings_and_output_weights", "decoder_first_pipeline_num_layers",
        "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout", "mock_data", "tokenizer_type",
        "vocab_size", "recompute_granularity", "bf16", "seq_length", "use_distributed_optimizer",
        "overlap_grad_reduce", "bias_swiglu_fusion", "apply_rope_fusion", "num_experts", "moe_router_topk",
        "moe_ffn_hidden_size", "moe_router_pre_softmax", "moe_router_load_balancing_type", "ffn_hidden_size",
        "moe_shared_expert_intermediate_size", "moe_shared_expert_gate", "add_qkv_bias", "moe_aux_loss_coeff",
        "moe_z_loss_coeff", "openai_gelu")
print("RESULT " + json.dumps({k: getattr(args, k, None) for k in keys}, default=str))
"""


def megatron_args(tmp_path, plan: dict, *train_args: str) -> tuple[list[str], dict, str]:
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(f), "--target", "megatron-lm", "--",
                          *train_args], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    script = out.stdout
    env = dict(re.findall(r"^export (\w+)=(\S+)", script, re.M))
    command = shlex.split(script[script.index("torchrun"):].replace("\\\n", " "), comments=True)
    return command[command.index("pretrain_gpt.py") + 1:], env, script


def parse(megatron_src, argv: list[str], env: dict, world: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHECK, str(megatron_src), json.dumps(argv),
                          json.dumps({**env, "WORLD_SIZE": str(world), "RANK": "0"})],
                         capture_output=True, text=True, timeout=300)
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and result, (out.stdout + out.stderr)[-4000:]
    return json.loads(result[0][7:])


LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 6,
         "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
         "rope_theta": 500000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False}
GPT2 = {"model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 1000, "n_positions": 1024}


def test_gpt_and_opt_plans_pass_megatrons_parser(megatron_src, tmp_path):
    argv, env, script = megatron_args(tmp_path, HOMO, "--train-iters", "100", "--lr", "3e-4")  # OPT-125m, TP 2
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    got = parse(megatron_src, argv, env, 16)
    assert (got["tensor_model_parallel_size"], got["pipeline_model_parallel_size"], got["data_parallel_size"]) == \
        (2, 2, 4)
    assert (got["micro_batch_size"], got["global_batch_size"], got["train_iters"], got["lr"]) == (2, 64, 100, 3e-4)
    assert got["mock_data"] and got["tokenizer_type"] == "NullTokenizer" and got["vocab_size"] == 50272
    assert not got["use_distributed_optimizer"] and not got["overlap_grad_reduce"]
    gpt2 = _with_model(tmp_path, HOMO, GPT2)
    argv, env, _ = megatron_args(tmp_path, gpt2, "--train-iters", "10", "--data-path", "corpus_text_document",
                                 "--use-distributed-optimizer", "--overlap-grad-reduce")
    got = parse(megatron_src, argv, env, 16)
    assert got["num_layers"] == 4 and not got["untie_embeddings_and_output_weights"] and not got["mock_data"]
    assert got["use_distributed_optimizer"] and got["overlap_grad_reduce"]


def test_llama_plan_with_an_uneven_split_passes_megatrons_parser(megatron_src, tmp_path):
    plan = _with_model(tmp_path, HOMO, LLAMA)  # layers: embedding, 6 blocks, final norm, head
    plan["stages"] = [{**plan["stages"][0], "layers": [0, 2]}, {**plan["stages"][1], "layers": [3, 8]}]
    argv, env, _ = megatron_args(tmp_path, plan, "--train-iters", "10")
    got = parse(megatron_src, argv, env, 16)
    assert got["swiglu"] and got["normalization"] == "RMSNorm" and got["position_embedding_type"] == "rope"
    assert got["group_query_attention"] and got["num_query_groups"] == 2 and not got["add_bias_linear"]
    assert got["rotary_base"] == 500000 and got["untie_embeddings_and_output_weights"]
    assert (got["decoder_first_pipeline_num_layers"], got["decoder_last_pipeline_num_layers"]) == (2, 4)
    assert got["bias_swiglu_fusion"] and got["apply_rope_fusion"]  # Megatron's defaults, as ours on CUDA
    argv, env, _ = megatron_args(tmp_path, plan, "--train-iters", "10", "--no-bias-swiglu-fusion", "--no-rope-fusion")
    got = parse(megatron_src, argv, env, 16)
    assert not got["bias_swiglu_fusion"] and not got["apply_rope_fusion"]
    # four stages with unequal middles: Megatron's explicit layout
    plan["stages"] = [{**HOMO["stages"][0], "layers": l} for l in ([0, 1], [2, 2], [3, 5], [6, 8])]
    argv, env, _ = megatron_args(tmp_path, plan, "--train-iters", "10")
    got = parse(megatron_src, argv, env, 16)
    assert got["pipeline_model_parallel_layout"] == "Et|t|ttt|tL"
    assert got["pipeline_model_parallel_size"] == 4 and got["data_parallel_size"] == 2


def test_starcoder_plan_passes_megatrons_parser(megatron_src, tmp_path):
    """GPTBigCode (StarCoder's block, small): its one key/value head as Megatron's grouped-query attention with one
    group, under TP 1 (TP cannot split it); learned positions, biases, tanh-GELU (--openai-gelu)."""
    bigcode = {"model_type": "gpt_bigcode", "n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 1000,
               "n_positions": 1024}
    single = {**HOMO, "stages": [{**st, "replicas": [{**r, "tp": 1} for r in st["replicas"]]} for st in HOMO["stages"]]}
    argv, env, _ = megatron_args(tmp_path, _with_model(tmp_path, single, bigcode), "--train-iters", "10")
    got = parse(megatron_src, argv, env, 8)
    assert got["group_query_attention"] and got["num_query_groups"] == 1 and got["tensor_model_parallel_size"] == 1
    assert got["add_bias_linear"] and got["openai_gelu"] and got["position_embedding_type"] == "learned_absolute"
    assert not got["untie_embeddings_and_output_weights"]


def test_recomputing_plan_passes_megatrons_parser(megatron_src, tmp_path):
    recomputing = {**HOMO, "stages": [{**st, "recompute": True} for st in HOMO["stages"]]}
    argv, env, _ = megatron_args(tmp_path, recomputing, "--train-iters", "10")
    assert parse(megatron_src, argv, env, 16)["recompute_granularity"] == "full"


def test_mixture_of_experts_plans_pass_megatrons_parser(megatron_src, tmp_path):
    """Mixtures of experts: Megatron's MoE layers with the same experts and router, and sailor's load-balancing
    loss (per sequence) as Megatron's seq_aux_loss, or none."""
    mixtral = {**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
    argv, env, _ = megatron_args(tmp_path, _with_model(tmp_path, HOMO, mixtral), "--train-iters", "10",
                                 "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001")
    got = parse(megatron_src, argv, env, 16)
    assert (got["num_experts"], got["moe_router_topk"], got["moe_ffn_hidden_size"], got["ffn_hidden_size"]) == \
        (8, 2, 1024, 1024)
    assert not got["moe_router_pre_softmax"] and got["moe_router_load_balancing_type"] == "seq_aux_loss"
    assert got["moe_aux_loss_coeff"] == 0.01 and got["moe_z_loss_coeff"] == 0.001
    assert got["tensor_model_parallel_size"] == 2 and got["swiglu"] and not got["add_bias_linear"]
    assert got["moe_shared_expert_intermediate_size"] is None and not got["moe_shared_expert_gate"]
    # Qwen2-MoE: the chosen probabilities as they are, a gated shared expert, q/k/v biases
    qwen2 = {**LLAMA, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 256, "shared_expert_intermediate_size": 1024}
    argv, env, _ = megatron_args(tmp_path, _with_model(tmp_path, HOMO, qwen2), "--train-iters", "10")
    got = parse(megatron_src, argv, env, 16)
    assert (got["num_experts"], got["moe_ffn_hidden_size"], got["moe_shared_expert_intermediate_size"]) == \
        (8, 256, 1024)
    assert got["moe_router_pre_softmax"] and got["moe_shared_expert_gate"] and got["add_qkv_bias"]
    assert got["moe_router_load_balancing_type"] == "none"
