"""`sailor profile model`: the profile it writes is the one the planner reads, measured on the runtime's layers."""
from __future__ import annotations

import datetime
import json

import pytest
from _profiler_helpers import QUICK, one_line_error, sailor

from planner.profiles.store import load_profiles
from planner.specs.model import get_model


def test_profile_loads_with_the_store(tiny_profile):
    model = get_model("tiny")
    store = load_profiles([str(tiny_profile)], model="tiny", runtime="sailor")  # for plans our runtime runs
    p = store.measured[("tiny", "CPU")]
    assert p.source == "measured" and p.precision == "fp32" and p.num_layers == model.num_layers == 6
    assert p.runtime == "sailor"  # `sailor profile` measures our runtime's layers
    assert sorted(p.times) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert sorted(p.memory) == [1, 2]
    for lt in p.times.values():
        assert len(lt.fwd) == len(lt.bwd) == 6 and all(t > 0 for t in lt.fwd + lt.bwd)
    assert p.optimizer_s_per_param > 0
    # the store hands the measured profile to the simulator, not an estimate
    assert store.get(model, store._gpus["CPU"]) is p
    # for Megatron-DeepSpeed's plans it is converted (its attention keeps the s x s probabilities)
    theirs = load_profiles([str(tiny_profile)], model="tiny").get(model, store._gpus["CPU"])
    assert theirs.meta["converted_from_runtime"] == "sailor" and theirs.runtime == "megatron-deepspeed"


def test_an_fp16_profile_serves_fp16_plans_as_measured(tiny_profile, tmp_path):
    """A profile measured in fp16 (`--precision fp16`, for GPUs without bf16; CUDA only, so here the CPU file
    relabelled): fp16 plans get it as measured, bf16 ones a conversion of it."""
    d = json.loads((tiny_profile / "tiny" / "CPU" / "profile.json").read_text())
    (tmp_path / "tiny" / "CPU").mkdir(parents=True)
    (tmp_path / "tiny" / "CPU" / "profile.json").write_text(json.dumps({**d, "precision": "fp16"}))
    model = get_model("tiny")
    store = load_profiles([str(tmp_path)], model="tiny", runtime="sailor")
    gpu = store._gpus["CPU"]
    fp16 = store.get(model, gpu, "fp16")
    assert fp16 is store.measured[("tiny", "CPU")] and fp16.precision == "fp16"
    bf16 = store.get(model, gpu, "bf16")
    assert bf16.precision == "bf16" and bf16.meta["converted_from"] == "fp16"


def test_file_keys_and_tags(tiny_profile):
    d = json.loads((tiny_profile / "tiny" / "CPU" / "profile.json").read_text())
    assert d["format"] == "sailor-profile" and d["version"] == 1 and d["model"] == "tiny" and d["gpu"] == "CPU"
    assert set(d["times"]) == {"1", "2"} and set(d["times"]["1"]) == {"1", "2"}
    assert set(d["times"]["2"]["2"]) == {"fwd", "bwd"}
    assert set(d["memory"]["2"]) == {"params", "activation_bytes", "output_bytes"}
    assert d["created"] == datetime.date.today().isoformat()
    assert d["software"]["torch"].startswith("2.") and "megatron-core" in d["software"]
    assert d["device"]["type"] == "cpu" and d["device"]["concurrent_processes"] == 1
    assert d["notes"]["blocks_measured"] == 2
    assert not (tiny_profile / "tiny" / "CPU" / "profile.partial.json").exists()


def test_memory_facts_come_from_the_runtime_layers(tiny_profile):
    """Parameters per GPU are those of the megatron layers the runtime builds, which the
    planner's model description counts independently (Megatron's TP layout)."""
    model = get_model("tiny")
    p = load_profiles([str(tiny_profile)], model="tiny").measured[("tiny", "CPU")]
    for tp in (1, 2):
        mem = p.layer_memory(tp)
        assert list(mem.params) == [model.params(layer, tp) for layer in range(model.num_layers)]
        # a stage boundary carries [s, b, h] fp32 activations: s * h * 4 bytes per sample
        assert mem.output_bytes[1] == model.seq_len * model.hidden * 4
        # blocks keep activations for backward; TP shards part of them
        assert mem.activation_bytes[1] > 0
    assert p.layer_memory(2).activation_bytes[1] < p.layer_memory(1).activation_bytes[1]


def test_the_estimator_counts_the_tensors_the_runtime_saves(tiny_profile):
    """estimate.activation_floats for our runtime against what autograd saved in the runtime's
    blocks (tiny: LayerNorm, learned positions, no SwiGLU, so the CPU saves what CUDA does): two norms'
    inputs and outputs, Q, K, V and the attention's output, both MLP activations; the log-sum-exp and
    the norms' statistics (a few floats per token) are not counted."""
    from planner.profiles.estimate import activation_floats

    model = get_model("tiny")
    p = load_profiles([str(tiny_profile)], model="tiny").measured[("tiny", "CPU")]
    for tp in (1, 2):
        counted = activation_floats(model, 1, tp, "sailor") * model.seq_len * 4  # fp32 bytes per sample
        assert p.layer_memory(tp).activation_bytes[1] == pytest.approx(counted, rel=0.03), tp


def test_simulate_and_plan_accept_it(tiny_profile, tmp_path):
    plan = {"model": "tiny", "global_batch_size": 4,
            "stages": [{"layers": [0, 2], "replicas": [{"gpu": "CPU", "tp": 2, "zone": "local"}]},
                       {"layers": [3, 5], "replicas": [{"gpu": "CPU", "tp": 1, "zone": "local"}]}],
            "pipelines": [{"microbatch_size": 2, "num_microbatches": 2}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    run = sailor("simulate", tmp_path / "plan.json", "--profiles", tiny_profile, "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["sources"]["profile tiny on CPU"] == "measured" and out["iteration_time_s"] > 0
    run = sailor("plan", "--model", "tiny", "--gpus", "CPU@local=2", "--global-batch", "4", "--profiles", tiny_profile,
                 "--microbatch-sizes", "1,2", "-o", tmp_path / "best.json", "--json")
    assert run.returncode == 0, run.stderr


def _partial(tmp_path, points: dict, **settings_over):
    """A progress file as an interrupted run leaves it, with the settings this run will have."""
    from dataclasses import asdict, replace

    from sailor_ext.profile.model_profile import ModelProfileRequest, check_request

    _, settings = check_request(ModelProfileRequest("tiny", str(tmp_path), warmup=1, repeats=3))
    settings = replace(settings, **settings_over)
    path = tmp_path / "tiny" / "CPU" / "profile.partial.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": "sailor-profile-partial", "settings": asdict(settings), "points": points,
                                "optimizer": {"1": {"seconds": 1e-3, "params": 100000}}, "oom": []}))
    return path


def test_resume_skips_finished_points(tmp_path):
    kinds = ["embedding", "block", "block", "head"]
    done = {"mbs": 1, "tp": 1, "kinds": kinds, "fwd": [123.0] * 4, "bwd": [456.0] * 4,
            "activation_bytes": [1.0] * 4, "output_bytes": [2.0] * 4, "params": [1, 2, 2, 3], "peak_bytes": None}
    _partial(tmp_path, {"1/1": {"kind": "point", **done}})
    run = sailor("profile", "model", "--model", "tiny", "--device", "cpu", "--micro-batch-sizes", "1,2", *QUICK,
                 "-o", tmp_path, "--resume")
    assert run.returncode == 0, run.stderr
    assert "[1/2] resuming" in run.stderr and "TP 1, microbatch 2: done" in run.stderr
    assert "microbatch 1: done" not in run.stderr  # not measured again
    d = json.loads((tmp_path / "tiny" / "CPU" / "profile.json").read_text())
    assert d["times"]["1"]["1"]["fwd"] == [123.0] * 6  # the finished point, kept (blocks expanded)
    assert 0 < max(d["times"]["2"]["1"]["fwd"]) < 1  # the new one, measured
    assert d["optimizer_s_per_param"] == pytest.approx(1e-8)  # the optimizer was timed before: kept too


def test_resume_with_other_settings_is_refused(tmp_path):
    _partial(tmp_path, {}, repeats=50)
    run = sailor("profile", "model", "--model", "tiny", "--device", "cpu", *QUICK, "-o", tmp_path, "--resume")
    one_line_error(run, "other settings", "repeats 50 -> 3", "without --resume")


def test_resume_without_a_run_is_refused(tmp_path):
    run = sailor("profile", "model", "--model", "tiny", "--device", "cpu", "-o", tmp_path, "--resume")
    one_line_error(run, "nothing to resume", "without --resume")


def test_expand_to_model_repeats_the_median_block():
    from sailor_ext.profile.layers import expand_to_model

    model = get_model("tiny")  # 4 blocks, alike
    kinds = ["embedding", "block", "block", "block", "head"]
    assert expand_to_model([1.0, 5.0, 3.0, 4.0, 9.0], kinds, model, 3) == [1.0, 4.0, 4.0, 4.0, 4.0, 9.0]


def test_concurrency_runs_load_ranks(tmp_path):
    """More busy processes than cores: load ranks run beside the measured one, and the mean is kept."""
    import os

    n = len(os.sched_getaffinity(0)) + 1
    run = sailor("profile", "model", "--model", "tiny", "--device", "cpu", "--micro-batch-sizes", "1", *QUICK,
                 "--concurrency", n, "-o", tmp_path, "--quiet", timeout=300)
    assert run.returncode == 0, run.stderr
    d = json.loads((tmp_path / "tiny" / "CPU" / "profile.json").read_text())
    assert d["device"]["concurrent_processes"] == n and d["notes"]["statistic"].startswith("mean")
    assert set(d["times"]) == {"1"}


def test_a_config_models_profile_applies_by_architecture(tmp_path):
    """A config.json model's profile carries its description: another path, or another name, of the same
    architecture gets it; another sequence length does not."""
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128,
           "_name_or_path": "org/tiny-llama"}
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text(json.dumps({**cfg, "_name_or_path": f"org/{d}"}))
    out = tmp_path / "profiles"
    run = sailor("profile", "model", "--model", tmp_path / "a", "--device", "cpu", "--micro-batch-sizes", "1",
                 *QUICK, "-o", out, "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    written = json.loads((out / "org--a" / "CPU" / "profile.json").read_text())
    assert written["model_config"] == get_model(str(tmp_path / "a")).to_dict()
    for model, source in (("b", "measured (org/a's: the same architecture)"), ("a", "measured")):
        run = sailor("plan", "--model", tmp_path / model, "--gpus", "CPU@local=1", "--global-batch", "2",
                     "--microbatch-sizes", "1", "--profiles", out, "-o", tmp_path / "plan.json")
        assert run.returncode == 0, run.stderr
        sim = json.loads(sailor("simulate", tmp_path / "plan.json", "--profiles", out, "--json").stdout)
        assert sim["sources"][f"profile org/{model} on CPU"] == source
    assert not load_profiles([str(out)], model=get_model(str(tmp_path / "b"), seq_len=64)).measured


def test_blocks_of_each_kind_are_measured(tmp_path):
    """A model whose blocks differ (DeepSeek-V3's dense first block, its sparse ones; SmolLM3's blocks without rotary
    positions; Qwen3.5's Gated DeltaNet blocks and attention blocks; Llama 4's dense and sparse blocks, chunked
    attention on the rotary ones, a scaled q on the NoPE one): one block of each kind is built and timed
    (--blocks 1), and each block of the model gets its kind's measurement: its parameters are those the planner
    counts for it."""
    configs = {"deepseek_v3": {"moe_intermediate_size": 32, "n_routed_experts": 8, "n_group": 4, "topk_group": 2,
                               "num_experts_per_tok": 2, "first_k_dense_replace": 1, "q_lora_rank": 24,
                               "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12},
               "smollm3": {"vocab_size": 128256, "no_rope_layer_interval": 3},
               "qwen3_5_text": {"head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                "linear_key_head_dim": 8, "linear_value_head_dim": 12, "full_attention_interval": 3},
               "llama4_text": {"head_dim": 16, "intermediate_size_mlp": 96, "intermediate_size": 32,
                               "num_local_experts": 4, "interleave_moe_layer_step": 2, "attention_chunk_size": 16,
                               "floor_scale": 16}}
    for model_type, fields in configs.items():
        cfg = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 300, "max_position_embeddings": 64,
               **fields}
        (tmp_path / model_type).mkdir()
        (tmp_path / model_type / "config.json").write_text(json.dumps(cfg))
        model = get_model(str(tmp_path / model_type))
        out = tmp_path / f"profiles-{model_type}"
        run = sailor("profile", "model", "--model", tmp_path / model_type, "--device", "cpu", "--micro-batch-sizes",
                     "1", "--blocks", "1", *QUICK, "-o", out)
        assert run.returncode == 0, run.stderr[-3000:]
        profile = load_profiles([str(out)], model=str(tmp_path / model_type), runtime="sailor").measured[
            (model.name, "CPU")]
        params = profile.layer_memory(1).params
        assert list(params) == [model.params(layer) for layer in range(model.num_layers)]
        assert {model.dense(b) or b in model.nope_blocks or model.linear(b) for b in range(4)} == {True, False}
        if model_type != "smollm3":  # (NoPE blocks hold the same weights as the others)
            assert len(set(params[1:5])) == 2


def test_a_profile_of_other_layers_is_named_when_skipped(tiny_profile, tmp_path):
    """Planning the tiny model at another sequence length than it was profiled at uses an estimate, as it must;
    the profile is no longer skipped without a word: a note on stderr names the file and the fields that differ
    (--quiet keeps to errors)."""
    args = ["plan", "--model", "tiny", "--seq-length", "32", "--gpus", "CPU@local=2", "--global-batch", "8",
            "--profiles", tiny_profile, "-o", tmp_path / "plan.json"]
    out = sailor(*args)
    assert out.returncode == 0, out.stderr
    profile = tiny_profile / "tiny" / "CPU" / "profile.json"
    assert out.stderr == f"sailor: note: profile {profile} measured tiny with other layers (seq_len 64, here 32), so " \
        "it is not used; profile the model as planned here (sailor profile model) to use measurements\n"
    assert "estimated: no measured profile of tiny on CPU" in out.stdout
    quiet = sailor(*args, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""
    same = sailor(*args[:4], "64", *args[5:])  # at the profiled length: measured, no note
    assert same.returncode == 0 and same.stderr == "" and "estimated: no measured profile" not in same.stdout
