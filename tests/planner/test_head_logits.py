"""Measured heads that never computed the logits (Sailor's GPT-Neo-2.7) get them."""
from dataclasses import replace

import pytest

from planner.profiles.estimate import DEFAULT_EFFICIENCY, layer_seconds
from planner.profiles.head_logits import lacks_logits, with_logits
from planner.profiles.profile import MEASURED, LayerMemory, LayerTimes, Profile
from planner.profiles.store import ProfileStore
from planner.specs.hardware import CATALOG
from planner.specs.model import get_model

NEO = get_model("gpt-neo-2.7b")
L = NEO.num_layers


def norm_only_profile(block_s=(0.02, 0.04)) -> Profile:
    """A head that kept 2h values per token (its norm), as Sailor's GPT-Neo profiles."""
    fwd, bwd = (1e-3,) + (block_s[0],) * (L - 2) + (1e-3,), (0.0,) + (block_s[1],) * (L - 2) + (1e-3,)
    times = {(8, 4): LayerTimes(fwd, bwd)}
    acts = (26e6,) + (242e6,) * (L - 2) + (4 * NEO.seq_len * 2 * NEO.hidden,)
    mem = {4: LayerMemory(tuple(NEO.params(i, 4) for i in range(L)), acts, (21e6,) * L)}
    return Profile("gpt-neo-2.7b", "GH200-96", L, "fp32", MEASURED, times, 1e-11, mem)


def test_the_logits_run_at_the_speed_the_gpu_measured_for_a_block():
    gpu = CATALOG["GH200-96"]
    slow = with_logits(norm_only_profile((0.02, 0.04)), NEO, gpu)
    fast = with_logits(norm_only_profile((0.01, 0.02)), NEO, gpu)
    logits = replace(NEO, separate_final_norm=True)
    est = layer_seconds(logits, logits.num_layers - 1, 8, 4, gpu, "fp32", DEFAULT_EFFICIENCY)
    block = layer_seconds(NEO, 1, 8, 4, gpu, "fp32", DEFAULT_EFFICIENCY)
    added = slow.times[(8, 4)].fwd[-1] - 1e-3
    assert added == pytest.approx(est[0] * 0.02 / block[0])
    assert fast.times[(8, 4)].fwd[-1] - 1e-3 == pytest.approx(added / 2)  # half as fast a GPU, half the time
    assert slow.times[(8, 4)].fwd[:-1] == norm_only_profile().times[(8, 4)].fwd[:-1]  # only the head changes


def test_the_head_keeps_the_logits_and_their_softmax():
    p = with_logits(norm_only_profile(), NEO, CATALOG["GH200-96"])
    kept = 4 * NEO.seq_len * 2 * NEO.padded_vocab(4) / 4  # fp32, 2 V/t values per token
    assert p.memory[4].activation_bytes[-1] == pytest.approx(4 * NEO.seq_len * 2 * NEO.hidden + kept)
    assert not lacks_logits(p.memory, NEO, "fp32") and p.meta["head_logits"] == "estimated"


def test_a_head_that_computed_its_logits_is_left_alone(sailor_store):
    opt = sailor_store.measured[("opt-350m", "GH200-96")]
    assert with_logits(opt, get_model("opt-350m"), CATALOG["GH200-96"]) is opt


def test_the_rule_reproduces_heads_that_were_measured_with_their_logits(sailor_store):
    """OPT-350's measured heads hold the logits: strip them to a head that kept nothing and took
    no time, complete it, and compare with the measurement (every GPU, microbatch size and TP)."""
    m = get_model("opt-350m")
    errors = []
    for (name, gpu), p in sailor_store.measured.items():
        if name != "opt-350m":
            continue
        stripped = replace(p, times={k: LayerTimes((*v.fwd[:-1], 0.0), (*v.bwd[:-1], 0.0)) for k, v in p.times.items()},
                           memory={t: LayerMemory(x.params, (*x.activation_bytes[:-1], 0.0), x.output_bytes)
                                   for t, x in p.memory.items()})
        done = with_logits(stripped, m, CATALOG[gpu])
        errors += [abs(sum((done.times[k].fwd[-1], done.times[k].bwd[-1])) / sum((v.fwd[-1], v.bwd[-1])) - 1)
                   for k, v in p.times.items()]
    assert len(errors) > 100 and sorted(errors)[len(errors) // 2] < 0.25  # median |error| 20 %


def test_sailors_gpt_neo_heads_are_completed(sailor_store):
    """Every GPU's GPT-Neo-2.7 head at TP 4, b 8: two thirds to one block of time and of memory."""
    for gpu in ("GH200-96", "A100-40", "V100-16"):
        p = sailor_store.get(NEO, CATALOG[gpu])
        lt = p.times[(8, 4)]
        assert 0.6 < (lt.fwd[-1] + lt.bwd[-1]) / (lt.fwd[1] + lt.bwd[1]) < 1.3
        assert p.memory[4].activation_bytes[-1] > p.memory[4].activation_bytes[1]  # logits: about a block


def test_estimated_gpus_get_the_logits_memory_too(sailor_data):
    from planner.profiles.store import load_profiles

    store: ProfileStore = load_profiles([str(sailor_data)])
    h100 = store.get(NEO, CATALOG["H100-80"])
    assert h100.source != MEASURED and not lacks_logits(h100.memory, NEO, "fp32")
