"""Model, hardware and plan specs: hand-checked numbers and clear errors."""
import json

import pytest

from planner.errors import SailorError
from planner.specs.hardware import Cluster, load_cluster, parse_gpus
from planner.specs.model import BLOCK, EMBEDDING, HEAD, get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage, plan_from_dict, plan_from_sailor, plan_to_dict, \
    plan_to_sailor


def test_opt350_layers_match_megatron_counts():
    m = get_model("OPT-350")  # Sailor's alias
    assert m.name == "opt-350m" and m.num_layers == 26
    assert [m.kind(0), m.kind(1), m.kind(24), m.kind(25)] == [EMBEDDING, BLOCK, BLOCK, HEAD]
    h = 1024
    assert m.params(1, 1) == 12 * h * h + 13 * h  # QKV, proj, fc1, fc2 weights + biases + 2 LayerNorms
    # TP 4: matmul weights and column biases split, row biases and norms replicated (6h)
    assert m.params(1, 4) == (12 * h * h + 7 * h) // 4 + 6 * h
    # vocab 50272 padded to a multiple of 128*tp, positions replicated
    assert m.padded_vocab(1) == 50304 and m.padded_vocab(4) == 50688
    assert m.params(0, 4) == 50688 // 4 * h + 2048 * h
    assert m.params(25, 1) == 50304 * h + 2 * h  # untied head + final LayerNorm


def test_tied_and_llama_layouts():
    neo = get_model("gpt-neo-2.7b")
    assert neo.params(neo.num_layers - 1, 1) == 2 * 2560  # the tied head owns only the final norm
    llama = get_model("LLAMA-3-8")
    assert llama.num_layers == 35 and llama.kind(33) == "final_norm"
    h, f = 4096, 16384  # Sailor's run: multi-head attention, SwiGLU with biases, 2 RMSNorms
    assert llama.params(1, 1) == 4 * h * h + 3 * h * f + (3 * h + 2 * f) + 2 * h + 2 * h


def test_block_activation_formula_by_hand():
    m = get_model("tiny")  # h=64, heads=4, seq=64, ffn=256
    h, s, a, f = 64, 64, 4, 256
    assert m.activation_floats(1, 2) == 3 * h + (3 * h + h + f + a * s) / 2
    assert m.forward_flops(1) == 2 * (4 * h * h + 2 * h * f) + 4 * s * h


def test_hf_config(tmp_path):
    cfg = {"model_type": "gpt2", "n_embd": 128, "n_layer": 3, "n_head": 4, "vocab_size": 1000, "n_positions": 256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = get_model(str(tmp_path / "config.json"))
    assert (m.hidden, m.num_blocks, m.ffn_hidden, m.seq_len, m.tied_embeddings) == (128, 3, 512, 256, True)
    (tmp_path / "bad.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(SailorError, match="not supported"):
        get_model(str(tmp_path / "bad.json"))


def test_unknown_model_and_gpu():
    with pytest.raises(SailorError, match="unknown model 'gpt-9'"):
        get_model("gpt-9")
    with pytest.raises(SailorError, match="unknown GPU type 'B300'"):
        Cluster().gpu("B300")
    assert Cluster().gpu("GH-96").name == "GH200-96"


def test_parse_gpus_and_egress():
    c = Cluster()
    pools = parse_gpus("A100-40@us-central1-a=8,V100@us-west1-b=4,A100-40@us-central1-a=8", c)
    assert {(p.gpu, p.zone, p.count) for p in pools} == {("A100-40", "us-central1-a", 16),
                                                         ("V100-16", "us-west1-b", 4)}
    with pytest.raises(SailorError, match="TYPE@ZONE=COUNT"):
        parse_gpus("A100-40", c)
    assert c.egress_per_gb("us-central1-a", "us-central1-a") == 0
    assert c.egress_per_gb("us-central1-a", "us-central1-b") == 0.01
    assert c.egress_per_gb("us-central1-a", "us-west1-b") == 0.02
    assert c.egress_per_gb("us-central1-a", "europe-west4-a") == 0.08


def test_cluster_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("gpus:\n  A100-40: {price_per_hour: 2.0}\n  MYGPU: {memory_gb: 48, fp32_tflops: 80, "
                 "bf16_tflops: 300, hbm_gbps: 1000, intra_node_gbps: 100, gpus_per_node: 8, node_nic_gbps: 10, "
                 "price_per_hour: 1.5, spot_price_per_hour: 0.5}\n"
                 "zones:\n  dc-1: {region: dc}\n"
                 "available:\n  - {gpu: MYGPU, zone: dc-1, count: 16}\nquotas: {dc-1: 8}\n")
    c = load_cluster(str(f))
    assert c.price_per_hour("A100-40", "us-central1-a") == 2.0
    assert c.gpu("MYGPU").memory_bytes == 48 * 2**30
    assert c.available[0].count == 16 and c.quotas == {"dc-1": 8} and c.zone("dc-1").region == "dc"
    f.write_text("gpus:\n  A100-40: {bogus: 1}\n")
    with pytest.raises(SailorError, match="unknown field 'gpus.A100-40.bogus'"):
        load_cluster(str(f))
    f.write_text("available:\n  - {gpu: A100-40, zone: dc-2, count: 16}\n")  # zones are declared, not guessed
    with pytest.raises(SailorError, match="available\\[0\\].zone: unknown zone 'dc-2'"):
        load_cluster(str(f))


def test_cluster_yaml_reads_as_yaml_1_2(tmp_path):
    """PyYAML alone reads YAML 1.1: a zone named `no` would be False, `1:30` 90 and `010` 8."""
    f = tmp_path / "c.yaml"
    f.write_text("zones:\n  no: {region: north}\n  on: {region: north}\n"
                 "available:\n  - {gpu: A100-40, zone: no, count: 010}\n  - {gpu: A100-40, zone: on, count: 0x10}\n")
    c = load_cluster(str(f))
    assert [(p.zone, p.count) for p in c.available] == [("no", 10), ("on", 16)]
    f.write_text("zones:\n  dc-1: {region: dc}\navailable:\n  - {gpu: A100-40, zone: dc-1, count: 1:30}\n")
    with pytest.raises(SailorError, match="available\\[0\\].count must be an integer.*'1:30'"):
        load_cluster(str(f))
    f.write_text("zones:\n  dc-1: {region: dc}\navailable:\n  - {gpu: A100-40, zone: dc-1, count: 1_000}\n")
    with pytest.raises(SailorError, match="count must be an integer.*'1_000'"):
        load_cluster(str(f))


def _plan(**kw):
    stages = kw.pop("stages", (Stage(0, 2, (Replica("A100-40", 2, "z"),) * 2), Stage(3, 5, (Replica("V100-16", 1, "z"),) * 2)))
    return Plan("tiny", 12, stages, (Pipeline(2, 4), Pipeline(4, 1)), **kw)


def test_plan_round_trips():
    p = _plan()
    assert plan_from_dict(json.loads(json.dumps(plan_to_dict(p)))) == p
    d = plan_to_dict(p)
    assert d["stages"][0]["replicas"] == [{"gpu": "A100-40", "tp": 2, "zone": "z", "count": 2}]
    with pytest.raises(SailorError, match="different microbatch sizes"):
        plan_to_sailor(p)
    uniform = Plan("tiny", 16, p.stages, (Pipeline(2, 4),) * 2)
    back = plan_from_sailor(plan_to_sailor(uniform), model="tiny")
    assert back.stages == uniform.stages and back.pipelines == uniform.pipelines


def test_recompute_round_trips_and_is_checked():
    p = _plan()
    p = Plan(p.model, 16, (Stage(0, 2, p.stages[0].replicas, recompute=True), p.stages[1]), (Pipeline(2, 4),) * 2)
    d = plan_to_dict(p)
    assert d["stages"][0]["recompute"] is True and "recompute" not in d["stages"][1]
    assert plan_from_dict(json.loads(json.dumps(d))) == p and p.recompute
    with pytest.raises(SailorError, match="recomputes activations"):
        plan_to_sailor(p)
    d["stages"][1]["recompute"] = "yes"
    with pytest.raises(SailorError, match="recompute must be true or false"):
        plan_from_dict(d)


def test_sailor_plan_with_uneven_split():
    d = {"pipeline_list": [{"num_stages": 1, "layers_per_stage": [list(range(6))],
                            "tmp_per_stage": [[[[["GH-96", 4, "z"]], 4]] * 3], "dp": [3]}], "mbs": 2, "gbs": 16}
    p = plan_from_sailor(d, model="tiny")
    assert [q.num_microbatches for q in p.pipelines] == [3, 3, 2]  # 8 microbatches over 3 pipelines
    assert p.stages[0].replicas[0].gpu == "GH200-96" and p.runtime == "megatron-deepspeed"


@pytest.mark.parametrize("stages, message", [
    ((Stage(0, 2, (Replica("CPU", 1, "z"),) * 2), Stage(4, 5, (Replica("CPU", 1, "z"),) * 2)), "a gap"),
    ((Stage(0, 2, (Replica("CPU", 1, "z"),) * 2), Stage(2, 5, (Replica("CPU", 1, "z"),) * 2)), "an overlap"),
    ((Stage(0, 4, (Replica("CPU", 1, "z"),) * 2),), "the last stage must end at layer 5"),
    ((Stage(0, 5, (Replica("CPU", 1, "z"),)),), "1 replicas but there are 2 pipelines"),
    ((Stage(0, 5, (Replica("V100-16", 8, "z"),) * 2),), "larger than its 4 GPUs per node"),
    ((Stage(0, 5, (Replica("CPU", 3, "z"),) * 2),), "power of two"),
])
def test_plan_check_errors(stages, message):
    with pytest.raises(SailorError, match=message):
        _plan(stages=stages).check(6, Cluster())


def test_plan_batch_must_match():
    p = Plan("tiny", 13, _plan().stages, (Pipeline(2, 4), Pipeline(4, 1)))
    with pytest.raises(SailorError, match="global batch is 13"):
        p.check(6)
