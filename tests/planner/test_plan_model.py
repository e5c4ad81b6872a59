"""One model description from plan to training: a plan carries its model and sequence length, every command
reads it back through `plan_model`, and measured profiles apply by architecture, not by name."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.errors import SailorError
from planner.launch import check_runnable
from planner.profiles.estimate import estimate_profile
from planner.profiles.profile import profile_dir, save_profile
from planner.profiles.store import load_profiles
from planner.specs.hardware import CATALOG
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage, plan_from_dict, plan_model, plan_to_dict, with_model

ROOT = Path(__file__).resolve().parents[2]

# Hugging Face's config of Meta-Llama-3-8B
LLAMA_3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
              "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}
# Sailor's LLAMA-3-8 run written as a Hugging Face config: the architecture of the llama-3-8b preset (full
# multi-head attention, a SwiGLU of 16384 with biases, GPT-2's vocabulary, tied head)
SAILOR_LLAMA = {**LLAMA_3_8B, "intermediate_size": 16384, "num_key_value_heads": 32, "vocab_size": 50257,
                "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "_name_or_path": "sailor-llama"}
# facebook/opt-350m: post-LN, ReLU, a 512-wide word embedding projected to 1024 (not the opt-350m preset)
OPT_350M = {"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
            "ffn_dim": 4096, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
            "do_layer_norm_before": False, "activation_function": "relu", "_name_or_path": "facebook/opt-350m"}
SMALL_LLAMA = {**LLAMA_3_8B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
               "max_position_embeddings": 131072, "_name_or_path": "small-llama"}


def sailor(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def one_line_error(out, fragment):
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and out.stderr.count("\n") == 1 and out.stderr.startswith("sailor: error: "), out.stderr
    assert fragment in out.stderr, out.stderr


def write_config(tmp_path, cfg, name="config.json"):
    f = tmp_path / name
    f.write_text(json.dumps(cfg))
    return f


def one_stage_plan(model, gpu="A100-40", tp=1, dp=1, mbs=1):
    return with_model(Plan(model.name, mbs * dp, (Stage(0, model.num_layers - 1, (Replica(gpu, tp, "z"),) * dp),),
                           (Pipeline(mbs, 1),) * dp), model)


# -- the plan file -------------------------------------------------------------------------------
def test_plan_round_trip_carries_a_config_model(tmp_path):
    model = get_model(str(write_config(tmp_path, SMALL_LLAMA)), seq_len=512)
    plan = one_stage_plan(model)
    d = plan_to_dict(plan)
    assert d["model"] == "small-llama" and d["seq_length"] == 512 and d["model_config"] == model.to_dict()
    back = plan_from_dict(json.loads(json.dumps(d)))
    assert back == plan and back.model_spec == model and plan_model(back) == model
    assert plan_to_dict(back) == d and not back.notes


def test_presets_write_their_name_and_sequence_length_only():
    model = get_model("opt-350m", seq_len=1024)
    d = plan_to_dict(one_stage_plan(model))
    assert d["model"] == "opt-350m" and d["seq_length"] == 1024 and "model_config" not in d
    assert plan_model(plan_from_dict(d)) == model
    # an older plan records no sequence length: the preset's own, or --seq-length
    old = plan_from_dict({k: v for k, v in d.items() if k != "seq_length"})
    assert plan_model(old).seq_len == 2048 and plan_model(old, seq_len=512).seq_len == 512


def test_seq_length_flag_must_agree_with_the_plan(tmp_path):
    plan = plan_from_dict(plan_to_dict(one_stage_plan(get_model("tiny", seq_len=32))))
    assert plan_model(plan, seq_len=32).seq_len == 32
    with pytest.raises(SailorError, match="contradicts the plan, which was made for sequence length 32"):
        plan_model(plan, seq_len=64)
    with pytest.raises(SailorError, match="must be a positive number"):
        plan_model(plan, seq_len=0)
    assert plan_model(plan, "tiny").seq_len == 32  # --model replaces the model, the plan's length stays


def _config(**fields):
    return lambda d: {**d, "model_config": {**d["model_config"], **fields}}


@pytest.mark.parametrize("change, message", [
    (lambda d: {**d, "model_config": {"name": "small-llama"}}, "malformed model description"),
    (lambda d: {**d, "model_config": "llama"}, "expected a JSON object"),
    (_config(tied_embeddings="yes"), "tied_embeddings must be bool"),
    (_config(family="bert"), "model family 'bert' is unknown"),
    (_config(colour=1), "unknown model field 'colour'"),
    (_config(hidden=100), "not divisible by 8 heads"),
    (lambda d: {**d, "seq_length": 256}, "seq_length 256 but model_config has seq_len 512"),
    (lambda d: {**d, "seq_length": 0}, "seq_length must be a positive integer"),
    (lambda d: {**d, "model": "other"}, "model 'other' but model_config describes 'small-llama'"),
])
def test_malformed_model_config_is_one_line(tmp_path, change, message):
    model = get_model(str(write_config(tmp_path, SMALL_LLAMA)), seq_len=512)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(change(plan_to_dict(one_stage_plan(model)))))
    for command in (("simulate", f), ("launch", f)):
        one_line_error(sailor(*command), message)


# -- plan -> simulate -> launch of a config.json model ---------------------------------------------
def test_config_model_from_plan_to_launch(tmp_path):
    cfg = write_config(tmp_path, SMALL_LLAMA)
    out = sailor("plan", "--model", cfg, "--gpus", "A100-40@us-central1-a=8", "--global-batch", "16", "--json",
                 "-o", tmp_path / "plan.json")
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    assert planned["seq_length"] == 2048 and planned["seq_length_source"] == \
        "default: min(2048, context 131072); set --seq-length"
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["model_config"] == get_model(str(cfg)).to_dict() and written["seq_length"] == 2048
    cfg.unlink()  # the plan alone describes the model from here on
    sim = sailor("simulate", tmp_path / "plan.json", "--json")
    assert sim.returncode == 0, sim.stderr
    simulated = json.loads(sim.stdout)
    assert simulated["iteration_time_s"] == pytest.approx(planned["iteration_time_s"], rel=1e-9)
    assert simulated["model"] == "small-llama" and simulated["seq_length_source"] == "the plan's"
    table = sailor("simulate", tmp_path / "plan.json")
    assert table.returncode == 0 and "sequence length 2048 (the plan's)" in table.stdout
    launch = sailor("launch", tmp_path / "plan.json")
    assert launch.returncode == 0, launch.stderr
    assert "-m sailor_ext.train --plan" in launch.stdout and str(tmp_path / "plan.json") in launch.stdout


def test_resolve_plan_of_the_runtime_uses_the_plans_model(tmp_path):
    from sailor_ext.train import parse_args, resolve_plan

    model = get_model(str(write_config(tmp_path, SMALL_LLAMA)), seq_len=128)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan_to_dict(one_stage_plan(model, gpu="CPU", tp=2))))
    plan, resolved, layout = resolve_plan(parse_args(["--plan", str(f), "--train-iters", "1"]), 2)
    assert resolved == model and layout.world_size == 2
    with pytest.raises(SailorError, match="contradicts the plan"):
        resolve_plan(parse_args(["--plan", str(f), "--train-iters", "1", "--seq-length", "64"]), 2)


def test_elastic_plans_carry_the_model_to_the_workers(tmp_path):
    from planner.elastic import protocol as P
    from planner.elastic.replan import Replanner
    from planner.search.goal import Goal
    from planner.specs.hardware import load_cluster

    cluster = load_cluster(None)
    model = get_model(str(write_config(tmp_path, SMALL_LLAMA)), seq_len=64)
    replanner = Replanner(model, cluster, load_profiles(None, dict(cluster.gpus), model), 8, Goal())
    proposal = replanner.propose([P.NodeInfo("a", "CPU", "local", 2)])
    assert proposal.plan.model_spec == model and proposal.plan.seq_length == 64
    published = P.Assignment(1, plan_to_dict(proposal.plan), proposal.ranks, 1024, {"CPU": 2})
    received = P.Assignment.from_json(published.to_json())
    assert plan_model(plan_from_dict(received.plan)) == model  # what sailor_ext/elastic/worker.py resolves


# -- --seq-length on the commands ----------------------------------------------------------------------
@pytest.mark.parametrize("seq, expect", [
    (None, (64, "default: tiny's own; set --seq-length")),
    ("32", (32, "--seq-length")),
    ("65", "exceeds the context length 64 of tiny"),
    ("0", "argument --seq-length: must be a positive integer up to 16777216, not '0'"),
    ("-4", "argument --seq-length: must be a positive integer up to 16777216, not '-4'"),
])
def test_plan_and_replay_seq_length(tmp_path, seq, expect):
    flag = ["--seq-length", seq] if seq else []
    plan = sailor("plan", "--model", "tiny", "--gpus", "A100-40@us-central1-a=2", "--global-batch", "8", *flag,
                  "--json", "-o", tmp_path / "p.json")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([{"Time": 0, "GPUs": 2}, {"Time": 600, "GPUs": 4}]))
    replay = sailor("replay", trace, "--model", "tiny", "--global-batch", "8", *flag, "--json")
    if isinstance(expect, str):
        one_line_error(plan, expect)
        one_line_error(replay, expect)
        return
    for out in (plan, replay):
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        assert (d["seq_length"], d["seq_length_source"]) == expect
    assert json.loads((tmp_path / "p.json").read_text())["seq_length"] == expect[0]
    table = sailor("plan", "--model", "tiny", "--gpus", "A100-40@us-central1-a=2", "--global-batch", "8", *flag,
                   "-o", tmp_path / "p.json")
    assert f"sequence length {expect[0]} ({expect[1]})" in table.stdout


def test_simulate_seq_length(tmp_path, sailor_data):
    sailor_plan = sailor_data / "validation" / "clariden" / "OPT-350" / "N16" / "plan_config_N16_D4.json"
    base = json.loads(sailor("simulate", sailor_plan, "--json").stdout)  # Sailor's plans record no length
    assert (base["seq_length"], base["seq_length_source"]) == (2048, "default: opt-350m's own; set --seq-length")
    short = json.loads(sailor("simulate", sailor_plan, "--json", "--seq-length", "1024").stdout)
    assert short["seq_length"] == 1024 and short["iteration_time_s"] < base["iteration_time_s"]
    one_line_error(sailor("simulate", sailor_plan, "--seq-length", "4096"), "exceeds the context length 2048")
    one_line_error(sailor("simulate", sailor_plan, "--seq-length", "0"), "must be a positive integer")
    ours = tmp_path / "p.json"
    assert sailor("plan", "--model", "tiny", "--gpus", "A100-40@us-central1-a=2", "--global-batch", "8",
                  "--seq-length", "32", "-o", ours).returncode == 0
    one_line_error(sailor("simulate", ours, "--seq-length", "16"), "contradicts the plan")
    assert json.loads(sailor("simulate", ours, "--json", "--seq-length", "32").stdout)["seq_length"] == 32


@pytest.mark.parametrize("extra, fragment", [
    (["--seq-length", "0"], "argument --seq-length: must be a positive integer"),
    (["--seq-length", "65"], "exceeds the context length 64 of tiny"),
    (["--seq-length", "32", "--", "--train-iters", "5", "--seq-length", "16"],
     "--seq-length 16 contradicts the job's sequence length 32"),
    (["--", "--train-iters", "5", "--model", "opt-125m"], "--model opt-125m contradicts sailor run --model tiny"),
    (["--", "--train-iters", "5", "--moe-aux-loss-coeff", "0.01"], "tiny has none; drop the flag"),
])
def test_sailor_run_checks_seq_length_before_starting(extra, fragment):
    if "--" not in extra:
        extra = [*extra, "--", "--train-iters", "5"]
    out = sailor("run", "--model", "tiny", "--global-batch", "12", "--gpus", "CPU@local=2", "--local", *extra)
    one_line_error(out, fragment)


# -- profiles apply by architecture --------------------------------------------------------------------
def _planned_sources(tmp_path, cfg, sailor_data, *flags):
    """`sailor plan` of the config on A100-40s, then `sailor simulate` of the plan it wrote: its profile sources."""
    out = sailor("plan", "--model", cfg, *flags, "--gpus", "A100-40@us-central1-a=32", "--global-batch", "32",
                 "--profiles", sailor_data, "-o", tmp_path / "plan.json")
    assert out.returncode == 0, out.stderr
    out = sailor("simulate", tmp_path / "plan.json", "--profiles", sailor_data, "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    return d["sources"][f"profile {d['model']} on A100-40"]


def test_a_config_with_a_presets_architecture_gets_its_measured_profile(tmp_path, sailor_data):
    cfg = write_config(tmp_path, SAILOR_LLAMA)
    assert get_model(str(cfg), 8192).architecture() == get_model("llama-3-8b").architecture()
    assert _planned_sources(tmp_path, cfg, sailor_data, "--seq-length", "8192") == \
        "measured (llama-3-8b's: the same architecture)"
    # the same layers at another sequence length, or with a longer context, are another architecture
    assert _planned_sources(tmp_path, cfg, sailor_data) == "estimated"  # the default, 2048 tokens
    longer = write_config(tmp_path, {**SAILOR_LLAMA, "max_position_embeddings": 131072}, "long.json")
    assert _planned_sources(tmp_path, longer, sailor_data, "--seq-length", "8192") == "estimated"
    # Meta's Llama-3-8B (grouped-query attention, 128k vocabulary) is not the model Sailor measured
    meta = write_config(tmp_path, LLAMA_3_8B, "meta.json")
    assert _planned_sources(tmp_path, meta, sailor_data, "--seq-length", "8192") == "estimated"
    # facebook/opt-350m is not the OPT-350 Sailor measured (post-LN, ReLU, a 512-wide projection)
    assert _planned_sources(tmp_path, write_config(tmp_path, OPT_350M, "opt.json"), sailor_data) == "estimated"


def test_the_store_matches_architectures_not_names(tmp_path, sailor_data):
    opt_hf = get_model(str(write_config(tmp_path, OPT_350M)))
    preset = get_model("OPT-350")
    gpu = CATALOG["A100-40"]
    store = load_profiles([str(sailor_data)], model=opt_hf)
    assert not store.measured and store.get(opt_hf, gpu).source == "estimated"
    store = load_profiles([str(sailor_data)], model=preset)
    assert {m for m, _ in store.measured} == {"opt-350m"} and store.get(preset, gpu).source == "measured"
    renamed = replace(preset, name="my-opt", hf_model_type="opt")
    assert store.get(renamed, gpu) is store.get(preset, gpu)
    assert load_profiles([str(sailor_data)], model=renamed).get(renamed, gpu).source == "measured"
    assert store.get(get_model("OPT-350", 1024), gpu).source == "estimated"


def test_our_profiles_carry_their_model(tmp_path):
    model = get_model(str(write_config(tmp_path, SMALL_LLAMA)), seq_len=64)
    measured = replace(estimate_profile(model, CATALOG["CPU"]), source="measured", meta={}, model_spec=model)
    path = save_profile(measured, str(tmp_path / "profiles"))
    assert path == profile_dir(tmp_path / "profiles", "small-llama", "CPU") / "profile.json"
    assert json.loads(path.read_text())["model_config"] == model.to_dict()
    other_name = replace(model, name="org/llama-copy")
    store = load_profiles([str(tmp_path / "profiles")], model=other_name)
    assert store.get(other_name, CATALOG["CPU"]).model == "small-llama"
    # another sequence length is not read at all
    assert not load_profiles([str(tmp_path / "profiles")], model=replace(model, seq_len=32)).measured
    nested = save_profile(replace(measured, model="org/llama"), str(tmp_path / "profiles"))
    assert nested.parent.parent.name == "org--llama"


def test_the_runtime_takes_every_family_and_checks_tp(tmp_path):
    llama = get_model(str(write_config(tmp_path, SMALL_LLAMA)), seq_len=64)  # 8 heads, 2 query groups
    check_runnable(one_stage_plan(llama, tp=2), llama)
    with pytest.raises(SailorError, match="TP 4 does not divide small-llama's 2 query groups"):
        check_runnable(one_stage_plan(llama, tp=4), llama)
    wide = replace(llama, ffn_hidden=500)
    with pytest.raises(SailorError, match="FFN width 500"):
        check_runnable(one_stage_plan(wide, tp=8), wide)


def test_a_multimodal_model_is_planned_as_its_language_model_with_a_note(tmp_path):
    """A multimodal config (Mistral Small 3.1's shape of wrapper around a small language model) plans as its
    language model, and says so once on stderr: the vision tower is neither loaded nor trained. --quiet keeps to
    errors; a text model gets no note."""
    config = write_config(tmp_path, {"model_type": "mistral3", "text_config": {**SMALL_LLAMA, "model_type": "mistral"},
                                     "vision_config": {"hidden_size": 1024}})
    args = ["plan", "--model", config, "--gpus", "CPU@local=2", "--global-batch", "8", "-o", tmp_path / "plan.json"]
    out = sailor(*args)
    assert out.returncode == 0, out.stderr
    assert out.stderr == f"sailor: note: {config} is a multimodal mistral3 model: sailor plans and trains its " \
        "language model on text; the vision tower is neither loaded nor trained, and export writes the language " \
        "model alone\n"
    assert sailor(*args, "--quiet").stderr == ""
    text = write_config(tmp_path, SMALL_LLAMA, "text.json")
    assert sailor("plan", "--model", text, *args[3:]).stderr == ""
