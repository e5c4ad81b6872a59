"""`sailor profile show` and `sailor profile merge`: inspect profiles, combine machines' directories."""
from __future__ import annotations

import json

import pytest
from _profiler_helpers import one_line_error, sailor

from test_network_fit import synthetic

from planner.profiles.network_fit import fit_link, network_document, write_network
from planner.profiles.profile import LayerMemory, LayerTimes, Profile, load_profile_file, save_profile
from planner.profiles.store import load_profiles


def make_profile(gpu="CPU", points=((1, 1), (2, 1)), scale=1.0, optimizer=2e-9) -> Profile:
    n = 6
    times = {(b, t): LayerTimes(tuple(scale * b * (i + 1) * 1e-3 / t for i in range(n)),
                                tuple(2 * scale * b * (i + 1) * 1e-3 / t for i in range(n))) for b, t in points}
    memory = {t: LayerMemory(tuple(1000 // t for _ in range(n)), tuple(5e4 / t for _ in range(n)),
                             tuple(16384.0 for _ in range(n))) for t in sorted({t for _, t in points})}
    return Profile("tiny", gpu, n, "fp32", "measured", times, optimizer, memory,
                   {"created": "2026-11-22", "software": {"torch": "2.13.0"}, "notes": {}})


def test_show_tables_and_json(tiny_profile):
    run = sailor("profile", "show", tiny_profile)
    assert run.returncode == 0, run.stderr
    assert "tiny on CPU" in run.stdout and "block f/b" in run.stdout and "ns per parameter" in run.stdout
    d = json.loads(sailor("profile", "show", tiny_profile, "--json").stdout)
    (p,) = d["profiles"]
    assert (p["model"], p["gpu"], p["layers"]) == ("tiny", "CPU", 6)
    assert [(r["tp"], r["mbs"]) for r in p["times"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    raw = load_profile_file(tiny_profile / "tiny" / "CPU" / "profile.json")
    row = p["times"][1]
    assert row["total_s"] == pytest.approx(sum(raw.times[(2, 1)].fwd) + sum(raw.times[(2, 1)].bwd))
    assert row["block_fwd_s"] == raw.times[(2, 1)].fwd[1]
    assert d["network"] is None


def test_merge_different_gpus_and_network(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    save_profile(make_profile("CPU"), str(a))
    save_profile(make_profile("A100-40", scale=0.01), str(b))
    write_network(network_document([fit_link(synthetic((-0.01, 0.2, 2.0), 5e-5))], [], {}), str(b / "network.json"))
    run = sailor("profile", "merge", a, b, "-o", tmp_path / "all", "--json")
    assert run.returncode == 0, run.stderr
    store = load_profiles([str(tmp_path / "all")])
    assert set(store.measured) == {("tiny", "CPU"), ("tiny", "A100-40")}
    assert store.network.intra_fit("CPU", 2).latency_s == pytest.approx(5e-5, rel=0.05)
    shown = json.loads(sailor("profile", "show", tmp_path / "all", "--json").stdout)
    assert [p["gpu"] for p in shown["profiles"]] == ["A100-40", "CPU"] and shown["network"]["links"]


def test_merge_combines_points_of_one_gpu(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    save_profile(make_profile(points=((1, 1), (2, 1))), str(a))
    save_profile(make_profile(points=((1, 2), (2, 2))), str(b))
    run = sailor("profile", "merge", a, b, "-o", tmp_path / "all")
    assert run.returncode == 0, run.stderr
    assert "combined point by point: tiny on CPU" in run.stdout
    merged = load_profile_file(tmp_path / "all" / "tiny" / "CPU" / "profile.json")
    assert sorted(merged.times) == [(1, 1), (1, 2), (2, 1), (2, 2)] and sorted(merged.memory) == [1, 2]
    assert merged.times[(2, 2)] == make_profile(points=((2, 2),)).times[(2, 2)]
    assert merged.meta["notes"]["merged_from"] == [str(a), str(b)]
    # and the planner can use every TP degree of the merged profile
    plan = {"model": "tiny", "global_batch_size": 4,
            "stages": [{"layers": [0, 5], "replicas": [{"gpu": "CPU", "tp": 2, "zone": "local"}]}],
            "pipelines": [{"microbatch_size": 2, "num_microbatches": 2}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    sim = sailor("simulate", tmp_path / "plan.json", "--profiles", tmp_path / "all", "--json")
    assert sim.returncode == 0, sim.stderr


def test_merge_conflict_needs_a_choice(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    save_profile(make_profile(), str(a))
    save_profile(make_profile(scale=2.0), str(b))
    one_line_error(sailor("profile", "merge", a, b, "-o", tmp_path / "all"), "microbatch 1, TP 1", "--prefer")
    run = sailor("profile", "merge", a, b, "-o", tmp_path / "all", "--prefer", "last")
    assert run.returncode == 0, run.stderr
    merged = load_profile_file(tmp_path / "all" / "tiny" / "CPU" / "profile.json")
    assert merged.times[(1, 1)] == make_profile(scale=2.0).times[(1, 1)]


def test_merge_converts_sailor_data(sailor_data, tmp_path):
    mine = tmp_path / "mine"
    save_profile(make_profile(), str(mine))
    run = sailor("profile", "merge", sailor_data, mine, "-o", tmp_path / "all")
    assert run.returncode == 0, run.stderr
    store = load_profiles([str(tmp_path / "all")])
    original = load_profiles([str(sailor_data)])
    assert ("tiny", "CPU") in store.measured and ("opt-350m", "V100-16") in store.measured
    assert store.measured[("opt-350m", "V100-16")].times == original.measured[("opt-350m", "V100-16")].times
    assert set(store.network.inter) == set(original.network.inter)


@pytest.mark.parametrize("setup, args, needles", [
    (None, ["show", "{tmp}/missing"], ["not found"]),
    ("empty", ["show", "{tmp}/empty"], ["holds no profiles"]),
    ("partial", ["show", "{tmp}/part"], ["unfinished run", "--resume"]),
    ("a", ["merge", "{tmp}/a", "-o", "{tmp}/out"], ["at least two"]),
    ("a", ["merge", "{tmp}/a", "{tmp}/a", "-o", "{tmp}/a"], ["overlaps a source"]),
    ("badjson", ["show", "{tmp}/bad"], ["not valid JSON"]),
    ("badnet", ["show", "{tmp}/net"], ["network profile", "missing field"]),
])
def test_bad_show_and_merge_input(tmp_path, setup, args, needles):
    if setup == "empty":
        (tmp_path / "empty").mkdir()
    elif setup == "partial":
        (tmp_path / "part" / "tiny" / "CPU").mkdir(parents=True)
        (tmp_path / "part" / "tiny" / "CPU" / "profile.partial.json").write_text("{}")
    elif setup == "a":
        save_profile(make_profile(), str(tmp_path / "a"))
    elif setup == "badjson":
        (tmp_path / "bad" / "tiny" / "CPU").mkdir(parents=True)
        (tmp_path / "bad" / "tiny" / "CPU" / "profile.json").write_text("{oops")
    elif setup == "badnet":
        (tmp_path / "net").mkdir()
        (tmp_path / "net" / "network.json").write_text(json.dumps({"intra": [{"gpu": "CPU"}]}))
    one_line_error(sailor("profile", *[a.format(tmp=tmp_path) for a in args]), *needles)


def test_export_to_sailors_layout_reads_back_the_same(tmp_path):
    """Our profile -> Sailor's layout -> read as Sailor's data: the same times, memory and optimizer cost."""
    from planner.profiles.sailor_data import is_sailor_dir, load_sailor_dir

    ours = make_profile(points=((1, 1), (2, 1), (1, 2), (2, 2)))
    save_profile(ours, tmp_path / "ours")
    (tmp_path / "sailor" / "llm_info.json").parent.mkdir()
    (tmp_path / "sailor" / "llm_info.json").write_text(json.dumps({"OPT-350": {"1": {}}}))  # kept
    run = sailor("profile", "export", tmp_path / "ours", "-o", tmp_path / "sailor")
    assert run.returncode == 0, run.stderr
    root = tmp_path / "sailor"
    assert is_sailor_dir(root) and (root / "profiles" / "tiny" / "CPU" / "profile.json").exists()
    info = json.loads((root / "llm_info.json").read_text())
    assert set(info) == {"OPT-350", "tiny"} and set(info["tiny"]) == {"1", "2"}
    profiles, _ = load_sailor_dir(root, "tiny")
    back = profiles[("tiny", "CPU")]
    assert back.times == ours.times
    assert {tp: back.memory[tp] for tp in ours.memory} == ours.memory  # the reader also derives TP 4 and 8
    assert back.optimizer_s_per_param == pytest.approx(ours.optimizer_s_per_param)


def test_export_of_sailors_own_data_round_trips(sailor_data, tmp_path):
    from planner.profiles.sailor_data import load_sailor_dir

    original, _ = load_sailor_dir(sailor_data, "OPT-350")
    run = sailor("profile", "export", sailor_data, "-o", tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "profiles" / "OPT-350" / "GH-96" / "profile.json").exists()
    again, _ = load_sailor_dir(tmp_path, "OPT-350")
    assert again.keys() == original.keys()
    for key, p in original.items():
        assert again[key].times == p.times and again[key].memory == p.memory, key
        assert again[key].optimizer_s_per_param == pytest.approx(p.optimizer_s_per_param), key


def test_export_refuses_its_source(tiny_profile):
    one_line_error(sailor("profile", "export", tiny_profile, "-o", tiny_profile), "overlaps the source")
