"""Malformed input to every command and every file kind: one line, exit 2, no traceback, within 10 s,
every input byte-identical and nothing written.

The cases are generated in families, so the suite covers what a user can get wrong rather than a
list of remembered mistakes:

  * every field of every file kind (plans in ours and Sailor's format, cluster files in YAML and
    JSON, profiles in ours and Sailor's layout, network fits, Hugging Face config.json, traces in
    JSON and CSV) x every way a value can be wrong for its type (missing, null, another type, a
    string of digits, a fraction, negative, zero, NaN, Infinity, huge, unknown names);
  * every file kind as a whole: empty, not UTF-8, truncated, binary, a directory, the wrong JSON
    type at the top, nested beyond reason;
  * every number-taking flag of plan, simulate, replay, launch, run, agent, profile, export x
    {0, -1, NaN, Infinity, huge, not a number, empty}; lists, names, paths and outputs that
    would replace an input;
  * damaged and foreign checkpoints for `sailor export`.

They run in-process (planner.cli.main), each in a fresh copy of a workspace of valid files; a few
run as real processes to show that no traceback reaches the terminal. The valid workspace itself
passes (test_the_valid_inputs_work), so each case fails for its own mistake.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]
DELETE = object()  # a mutation that removes the field
NAN, INF = float("nan"), float("inf")

# -- the valid workspace ------------------------------------------------------------------
PLAN = {"format": "sailor-plan", "version": 1, "model": "tiny", "seq_length": 64, "global_batch_size": 8,
        "runtime": "sailor", "distributed_optimizer": False,
        "stages": [{"layers": [0, 2], "recompute": False,
                    "replicas": [{"gpu": "CPU", "tp": 1, "zone": "local", "count": 2}]},
                   {"layers": [3, 5], "replicas": [{"gpu": "CPU", "tp": 1, "zone": "local", "count": 2}]}],
        "pipelines": [{"microbatch_size": 2, "num_microbatches": 2, "count": 2}]}
SAILOR_PLAN = {"pipeline_list": [{"num_stages": 2, "layers_per_stage": [list(range(0, 13)), list(range(13, 26))],
                                  "tmp_per_stage": [[[[["A100-40", 1, "us-central1-a"]], 1]] * 2] * 2,
                                  "dp": [2, 2]}],
               "mbs": 2, "gbs": 16}
CLUSTER = {"gpus": {"A100-40": {"price_per_hour": 3.2},
                    "MYGPU": {"memory_gb": 48, "fp32_tflops": 80, "bf16_tflops": 300, "hbm_gbps": 1000,
                              "intra_node_gbps": 100, "gpus_per_node": 8, "node_nic_gbps": 10,
                              "price_per_hour": 1.5, "spot_price_per_hour": 0.5}},
           "zones": {"dc-1": {"region": "dc"}},
           "available": [{"gpu": "A100-40", "zone": "us-central1-a", "count": 4},
                         {"gpu": "MYGPU", "zone": "dc-1", "count": 8, "spot": True}],
           "quotas": {"us-central1-a": 4},
           "prices": [{"gpu": "A100-40", "zone": "us-central1-a", "price_per_hour": 3.0}],
           "egress_usd_per_gb": {"us-central1-a": {"dc-1": 0.05}}}
HF_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128,
             "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
NETWORK = {"format": "sailor-network", "version": 1,
           "intra": [{"gpu": "CPU", "gpus": 2, "coeffs": [0.0, 0.0, 5.0], "max_bytes_per_s": 5e9, "latency_s": 1e-5,
                      "min_bytes": 64000.0, "max_bytes": 6.4e7, "allreduce_efficiency": 0.5}],
           "inter": [{"src_zone": "local", "src_gpu": "CPU", "src_gpus": 1, "dst_zone": "local", "dst_gpu": "CPU",
                      "dst_gpus": 1, "coeffs": [0.0, 0.0, 1.0], "max_bytes_per_s": 1e9}],
           "allreduce": []}
SAILOR_INTRA = {"CPU": {"2": [[0.0, 0.0, 5.0], 5e9]}}
SAILOR_INTER = {"local": {"CPU": {"1": {"local": {"CPU": {"1": [[0.0, 0.0, 1.0], 1e9]}}}}}}
TRACE = [{"Time": 0, "GPUs": 2}, {"Time": 600, "GPUs": 4}]
TRACE_CSV = ",Timestamp,CPU_local\n0,100.0,2\n1,700.0,4\n"
TINY_SPEC = {"name": "tiny", "family": "opt", "hidden": 64, "num_blocks": 4, "heads": 4, "ffn_hidden": 256, "vocab": 512,
             "seq_len": 64, "max_positions": 64}  # a plan's model_config of the tiny preset
NEO_CONFIG = {"model_type": "gpt_neo", "hidden_size": 64, "num_layers": 4, "num_heads": 4, "vocab_size": 512,
              "max_position_embeddings": 128, "attention_types": [[["global", "local"], 2]]}

SIMULATE = ["simulate", "plan.json", "--profiles", "profiles"]
PLAN_CMD = ["plan", "--model", "tiny", "--gpus", "CPU@local=2", "--global-batch", "8", "-o", "out.json"]
CLUSTER_CMD = ["plan", "--model", "tiny", "--global-batch", "8", "-o", "out.json", "--cluster"]
REPLAY = ["replay", "--model", "tiny", "--gpu", "CPU", "--zone", "local", "--global-batch", "8", "--policies",
          "sailor"]
REPLAY_CSV = ["replay", "trace.csv", "--model", "tiny", "--global-batch", "8", "--policies", "sailor"]  # (its own GPUs)
RUN = ["run", "--model", "tiny", "--global-batch", "12", "--gpus", "CPU@local=6", "--gpus-per-node", "2", "--local"]
TRAIN = ["--", "--train-iters", "5"]


def _profile_doc() -> dict:
    from planner.profiles.estimate import estimate_profile
    from planner.profiles.profile import profile_to_dict
    from planner.specs.hardware import CATALOG
    from planner.specs.model import get_model

    p = estimate_profile(get_model("tiny"), CATALOG["CPU"])
    return profile_to_dict(replace(p, source="measured", meta={"created": "2026-01-01"}, model_spec=get_model("tiny")))


def _dump(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".yaml", ".yml"):
        path.write_text(yaml.dump(value, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False))
    elif isinstance(value, (bytes, str)):
        path.write_bytes(value if isinstance(value, bytes) else value.encode())
    else:
        path.write_text(json.dumps(value, indent=1))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """Valid files of every kind (and fake checkpoints, which no case may read as valid)."""
    from planner.profiles.profile import profile_from_dict
    from planner.profiles.sailor_data import save_sailor_dir

    ws = tmp_path_factory.mktemp("workspace")
    profile = _profile_doc()
    for name, value in (("plan.json", PLAN), ("sailor_plan.json", SAILOR_PLAN), ("cluster.yaml", CLUSTER),
                        ("cluster.json", CLUSTER), ("config.json", HF_CONFIG), ("trace.json", TRACE),
                        ("trace.csv", TRACE_CSV), ("profiles/tiny/CPU/profile.json", profile),
                        ("profiles/network.json", NETWORK), ("other/tiny/CPU/profile.json", profile)):
        _dump(ws / name, value)
    sailor = ws / "sailor-profiles"
    save_sailor_dir([profile_from_dict(profile, "x")], sailor)
    data = json.loads((sailor / "profiles" / "tiny" / "CPU" / "profile.json").read_text())
    _dump(sailor / "profiles" / "profiles_tmp.json", {"tiny": {"CPU": data}})
    _dump(sailor / "providers" / "intra_node_bandwidths.json", SAILOR_INTRA)
    _dump(sailor / "providers" / "multizone_bandwidths_het.json", SAILOR_INTER)
    _checkpoints(ws)
    return ws


def _checkpoints(ws: Path) -> None:
    """Damaged and foreign checkpoint directories."""
    meta = {"format": "sailor-checkpoint", "version": 1, "step": 10, "model": "tiny"}
    layouts = {
        "empty": {},
        "dangling": {"latest": "iter_0000010"},
        "badmeta": {"latest": "iter_0000010", "iter_0000010/meta.json": "{not json"},
        "foreign": {"meta.json": json.dumps({"format": "something-else", "step": 1})},
        "binarymeta": {"meta.json": b"\xff\xfe\x00garbage"},
        "garbage-rank": {"meta.json": json.dumps(meta), "rank00000.pt": b"this is no torch file"},
        "no-rank": {"meta.json": json.dumps({**meta, "files": {"rank00000.pt": {"bytes": 10, "sha256": "0" * 64}}})},
        "hf-model": {"config.json": json.dumps(HF_CONFIG), "model.safetensors": b"\x00" * 16},
        "checksum": {"latest": "iter_0000010", "iter_0000010/meta.json": json.dumps(
            {**meta, "files": {"rank00000.pt": {"bytes": 5, "sha256": "0" * 64}}}),
            "iter_0000010/rank00000.pt": b"12345"},
    }
    for name, files in layouts.items():
        root = ws / "ckpt" / name
        root.mkdir(parents=True)
        for rel, content in files.items():
            _dump(root / rel, content)
    (ws / "ckpt" / "a-file").write_text("not a directory")
    try:
        import torch
    except ImportError:
        return
    for name, pieces, extra in (
            ("wrong-pieces", [{"name": "layers.0.word_embeddings.weight"}], {}),
            ("foreign-tensor", [{"name": "bogus.weight", "dim": None, "start": 0, "stop": 1, "param": torch.zeros(2)}],
             {}),
            ("not-a-list", {"a": 1}, {}),
            ("no-step", [], {"step": DELETE}),
            ("bad-model", [], {"model_config": {"hidden": -1}}),
            ("unknown-model", [], {"model": "gpt-9"})):
        root = ws / "ckpt" / name
        root.mkdir(parents=True)
        m = {k: v for k, v in {**meta, **extra}.items() if v is not DELETE}
        _dump(root / "meta.json", m)
        torch.save(pieces, root / "rank00000.pt")
    from sailor_ext import checkpoint
    from sailor_ext.storage import Storage

    # sealed and well-formed, but holding no tensors (exported an empty model, exit 0)
    checkpoint.commit(Storage(str(ws / "ckpt" / "no-tensors")), 10, [],
                      {"consumed_samples": 0, "optimizer_steps": 10, "model": "tiny"})


# -- running a case ----------------------------------------------------------------------
def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def invoke(argv: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def check_refused(argv: list[str], cwd: Path) -> None:
    """The contract: exit 2, one line `sailor: error: ...`, no traceback, within 10 s, inputs as they were."""
    before = _files(cwd)
    code, out, err, seconds = invoke(argv)
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code} for {argv}: {err[-2000:] or out[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("sailor: error: "), f"{argv}: {err[-2000:]}"
    assert not re.search(r"\d{50}", lines[0]), f"{argv}: a number is not shortened: {lines[0][:300]}..."
    assert len(lines[0]) < 2000, f"{argv}: a value is not shortened: {lines[0][:300]}..."
    assert "Traceback" not in err and out == "", f"{argv}: {out[-500:]}"
    assert seconds < 10, f"{argv} took {seconds:.1f} s"
    assert _files(cwd) == before, f"{argv} changed or wrote files"


@pytest.fixture
def case(workspace, tmp_path, monkeypatch):
    """A fresh copy of the workspace as the working directory."""
    work = tmp_path / "w"
    shutil.copytree(workspace, work, symlinks=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("SAILOR_PROFILES", raising=False)
    return work


# -- mutations ------------------------------------------------------------------------------
def _set(doc, path: tuple, value):
    """A copy of `doc` with the field at `path` replaced (or removed with DELETE)."""
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


WRONG_TYPES = {"null": None, "list": [1], "object": {"a": 1}, "bool": True}


def bad_values(kind: str, required: bool = True, lo=None, hi=None) -> dict:
    """Every value that is wrong for a field of this kind (named, for the test ids)."""
    out = dict(WRONG_TYPES)
    if required:
        out["missing"] = DELETE
    if kind in ("int", "number"):
        out.update({"string": "2", "nan": NAN, "infinity": INF, "minus-infinity": -INF})
        if kind == "int":
            out["fraction"] = 2.5
        if lo is not None:
            out["below"] = lo - 1 if kind == "int" or lo > 0 else -1.0
            if lo > 0 and kind == "number":
                out["zero"] = 0
        if hi is not None:
            out["above"] = hi + 1 if kind == "int" else hi * 10
            out["huge"] = 10 ** 30 if kind == "int" else 1e300
        out["big-int"] = 10 ** 400  # a JSON integer no float can hold
    elif kind == "str":
        out.update({"number": 5, "empty": "", "line-break": "a\nb", "control-char": "a\x1b[31mb"})
    elif kind == "bool":
        out.update({"string": "yes", "number": 1})
        del out["bool"]
    elif kind == "list":
        out.update({"string": "x", "number": 5})
        del out["list"]
    elif kind == "object":
        out.update({"string": "x", "number": 5})
        del out["object"]
    return out


def family(fields: list[tuple], extra: dict | None = None) -> list[tuple[str, tuple, object]]:
    """(id, path, value) for every field spec (path, kind, required, lo, hi) and every bad value."""
    out = []
    for path, kind, required, lo, hi in fields:
        for name, value in bad_values(kind, required, lo, hi).items():
            out.append((f"{'.'.join(map(str, path))}={name}", path, value))
    for name, (path, value) in (extra or {}).items():
        out.append((name, path, value))
    return out


def ids(cases):
    return [c[0] for c in cases]


# -- plan files: ours ---------------------------------------------------------------------
R = ("stages", 0, "replicas", 0)
PLAN_FIELDS = [
    (("format",), "str", False, None, None), (("version",), "int", False, 1, 1), (("model",), "str", True, None, None),
    (("seq_length",), "int", False, 1, 1 << 24), (("global_batch_size",), "int", True, 1, 1 << 24),
    (("runtime",), "str", False, None, None), (("distributed_optimizer",), "bool", False, None, None),
    (("stages",), "list", True, None, None),
    (("stages", 0), "object", True, None, None), (("stages", 0, "layers"), "list", True, None, None),
    (("stages", 0, "layers", 0), "int", True, 0, 8192), (("stages", 0, "layers", 1), "int", True, 0, 8192),
    (("stages", 0, "recompute"), "bool", False, None, None), (("stages", 0, "replicas"), "list", True, None, None),
    (R, "object", True, None, None), (R + ("gpu",), "str", True, None, None), (R + ("tp",), "int", True, 1, 64),
    (R + ("zone",), "str", True, None, None), (R + ("count",), "int", False, 1, 1 << 20),
    (("pipelines",), "list", True, None, None), (("pipelines", 0), "object", True, None, None),
    (("pipelines", 0, "microbatch_size"), "int", True, 1, 1 << 24),
    (("pipelines", 0, "num_microbatches"), "int", True, 1, 1 << 24),
    (("pipelines", 0, "count"), "int", False, 1, 1 << 20),
]
PLAN_CASES = family(PLAN_FIELDS, {
    "unknown-key": (("stagse",), []), "unknown-replica-key": (R + ("zones",), "local"),
    "format-other": (("format",), "other"), "runtime-other": (("runtime",), "deepspeed"),
    "gpu-unknown": (R + ("gpu",), "B300"), "zone-unknown": (R + ("zone",), "mars-1"),
    "zone-typo": (R + ("zone",), "us-centrl1-a"), "tp-3": (R + ("tp",), 3), "tp-beyond-node": (R + ("tp",), 16),
    "model-unknown": (("model",), "gpt-9"), "batch-mismatch": (("global_batch_size",), 9),
    "layers-gap": (("stages", 1, "layers"), [4, 5]), "layers-short": (("stages", 0, "layers"), [0]),
    "layers-reversed": (("stages", 0, "layers"), [2, 0]), "layers-beyond-model": (("stages", 1, "layers"), [3, 9]),
    "replicas-empty": (("stages", 0, "replicas"), []), "stages-empty": (("stages",), []),
    "pipelines-empty": (("pipelines",), []), "model-config-unknown-field": (("model_config",), {"x": 1}),
    "replica-count-mismatch": (R + ("count",), 1), "seq-beyond-context": (("seq_length",), 65),
    "vocab-divisor-zero": (("model_config",), {**TINY_SPEC, "vocab_divisor": 0}),
    "vocab-divisor-negative": (("model_config",), {**TINY_SPEC, "vocab_divisor": -1}),
})


@pytest.mark.parametrize("name, path, value", PLAN_CASES, ids=ids(PLAN_CASES))
def test_plan_file(case, name, path, value):
    _dump(case / "plan.json", _set(PLAN, path, value))
    check_refused(SIMULATE, case)


LAUNCH_SAMPLE = [c for c in PLAN_CASES if c[0].split("=")[-1] in ("missing", "nan", "fraction") or "-" in c[0]][::3]


@pytest.mark.parametrize("name, path, value", LAUNCH_SAMPLE, ids=ids(LAUNCH_SAMPLE))
def test_plan_file_in_launch(case, name, path, value):
    _dump(case / "plan.json", _set(PLAN, path, value))
    check_refused(["launch", "plan.json"], case)


# -- plan files: Sailor's format ------------------------------------------------------------
P0 = ("pipeline_list", 0)
SAILOR_PLAN_FIELDS = [
    (("mbs",), "int", True, 1, 1 << 24), (("gbs",), "int", True, 1, 1 << 24),
    (("pipeline_list",), "list", True, None, None),
    (P0 + ("layers_per_stage",), "list", True, None, None), (P0 + ("layers_per_stage", 0), "list", True, None, None),
    (P0 + ("layers_per_stage", 0, 0), "int", True, 0, 8192), (P0 + ("tmp_per_stage",), "list", True, None, None),
    (P0 + ("tmp_per_stage", 0, 0, 0, 0, 0), "str", True, None, None),
    (P0 + ("tmp_per_stage", 0, 0, 0, 0, 1), "int", True, 1, 64),
    (P0 + ("tmp_per_stage", 0, 0, 0, 0, 2), "str", True, None, None), (P0 + ("dp",), "list", True, None, None),
    (P0 + ("dp", 0), "int", True, 1, 1 << 20), (P0 + ("tmp_per_stage", 0, 0, 1), "int", True, 1, 64),
]
SAILOR_PLAN_CASES = [c for c in family(SAILOR_PLAN_FIELDS, {
    "two-templates": (("pipeline_list",), [SAILOR_PLAN["pipeline_list"][0]] * 2),
    "layers-not-consecutive": (P0 + ("layers_per_stage", 0), [0, 2, 3]),
    "dp-differs": (P0 + ("dp",), [2, 1]), "dp-vs-replicas": (P0 + ("dp",), [3, 3]),
    "gbs-not-multiple": (("gbs",), 15), "gpu-unknown": (P0 + ("tmp_per_stage", 0, 0, 0, 0, 0), "B300"),
    "zone-unknown": (P0 + ("tmp_per_stage", 0, 0, 0, 0, 2), "mars-1"),
    "replica-shape": (P0 + ("tmp_per_stage", 0, 0), ["A100-40", 1, "us-central1-a"]),
    "replica-tp-twice": (P0 + ("tmp_per_stage", 0, 0, 1), 2),  # [[[GPU, TP, ZONE]], TP]: the same TP
}) if c[0] != "pipeline_list=missing"]  # without pipeline_list it is not Sailor's format: read as ours, refused too


@pytest.mark.parametrize("name, path, value", SAILOR_PLAN_CASES, ids=ids(SAILOR_PLAN_CASES))
def test_sailor_plan_file(case, name, path, value):
    _dump(case / "sailor_plan.json", _set(SAILOR_PLAN, path, value))
    check_refused(["simulate", "sailor_plan.json"], case)


# -- cluster files --------------------------------------------------------------------------
G = ("gpus", "MYGPU")
CLUSTER_FIELDS = [
    (("gpus",), "object", False, None, None), (("gpus", "A100-40"), "object", False, None, None),
    (("gpus", "A100-40", "price_per_hour"), "number", False, 0, 1e6),
    (G + ("memory_gb",), "number", True, 1, 1e6), (G + ("fp32_tflops",), "number", True, 1e-9, 1e7),
    (G + ("bf16_tflops",), "number", True, 1e-9, 1e7), (G + ("hbm_gbps",), "number", True, 1e-9, 1e7),
    (G + ("intra_node_gbps",), "number", True, 1e-9, 1e7), (G + ("gpus_per_node",), "int", True, 1, 1024),
    (G + ("node_nic_gbps",), "number", True, 1e-9, 1e7), (G + ("price_per_hour",), "number", True, 0, 1e6),
    (G + ("spot_price_per_hour",), "number", True, 0, 1e6), (("zones",), "object", False, None, None),
    (("zones", "dc-1", "region"), "str", False, None, None), (("available",), "list", False, None, None),
    (("available", 0), "object", False, None, None), (("available", 0, "gpu"), "str", True, None, None),
    (("available", 0, "zone"), "str", True, None, None), (("available", 0, "count"), "int", True, 0, 1 << 20),
    (("available", 1, "spot"), "bool", False, None, None), (("quotas",), "object", False, None, None),
    (("quotas", "us-central1-a"), "int", False, 0, 1 << 20), (("prices",), "list", False, None, None),
    (("prices", 0, "gpu"), "str", True, None, None), (("prices", 0, "zone"), "str", True, None, None),
    (("prices", 0, "price_per_hour"), "number", True, 0, 1e6), (("egress_usd_per_gb",), "object", False, None, None),
    (("egress_usd_per_gb", "us-central1-a"), "object", False, None, None),
    (("egress_usd_per_gb", "us-central1-a", "dc-1"), "number", False, 0, 1e3),
]
CLUSTER_CASES = [c for c in family(CLUSTER_FIELDS, {
    "misspelled-top-key": (("availible",), []), "unknown-gpu-field": (("gpus", "A100-40", "prize"), 1.0),
    "available-gpu-unknown": (("available", 0, "gpu"), "B300"),
    "available-zone-undeclared": (("available", 0, "zone"), "dc-2"),
    "available-zone-typo": (("available", 0, "zone"), "us-centrl1-a"),
    "available-extra-key": (("available", 0, "cost"), 1), "quota-zone-unknown": (("quotas", "mars-1"), 4),
    "price-zone-unknown": (("prices", 0, "zone"), "mars-1"), "price-gpu-unknown": (("prices", 0, "gpu"), "B300"),
    "egress-zone-unknown": (("egress_usd_per_gb", "mars-1"), {"dc-1": 0.01}),
    "egress-to-unknown": (("egress_usd_per_gb", "us-central1-a", "mars-1"), 0.01),
    "gpu-name-reserved": (("gpus", "MY@GPU"), {"price_per_hour": 1.0}),
    "zone-name-reserved": (("zones", "dc=2"), {"region": "dc"}),
    "zone-name-line-break": (("zones", "dc\n1"), {"region": "dc"}),  # listed as two zones
    "gpu-name-tab": (("gpus", "MY\tGPU"), CLUSTER["gpus"]["MYGPU"]),
    "zone-extra-key": (("zones", "dc-1", "country"), "x"),
    "new-gpu-incomplete": (("gpus", "NEWGPU"), {"memory_gb": 10}),
    "available-empty": (("available",), []),  # no GPUs: refused, not planned on the example cluster
    "available-all-zero": (("available",), [{"gpu": "A100-40", "zone": "us-central1-a", "count": 0}]),
    "quotas-all-zero": (("quotas",), {"us-central1-a": 0, "dc-1": 0}),  # said: no microbatch size fits
}) if not c[0].startswith(("gpus=null", "zones=null", "available=null", "quotas=null", "prices=null",
                           "egress_usd_per_gb=null"))]  # an empty section in YAML is null: allowed


CLUSTER_CASES = [(n + "-json", p, v, "json") for n, p, v in CLUSTER_CASES] + \
    [(n + "-yaml", p, v, "yaml") for n, p, v in CLUSTER_CASES[::2]]  # YAML reaches the same checks
CLUSTER_CASES += [  # a lone surrogate escape (\ud800) is no text: JSON only, YAML cannot even write one
    ("zone-surrogate-json", ("zones", "z\ud800"), {"region": "x"}, "json"),
    ("region-surrogate-json", ("zones", "dc-1", "region"), "dc\udfff", "json")]


@pytest.mark.parametrize("name, path, value, suffix", CLUSTER_CASES, ids=ids(CLUSTER_CASES))
def test_cluster_file(case, name, path, value, suffix):
    _dump(case / f"cluster.{suffix}", _set(CLUSTER, path, value))
    check_refused(CLUSTER_CMD + [f"cluster.{suffix}"], case)


@pytest.mark.parametrize("text, suffix", [
    ('{"available": [{"gpu": "A100-40", "zone": "us-central1-a", "count": 2, "count": 4}]}', "json"),
    ("available:\n  - {gpu: A100-40, zone: us-central1-a, count: 2, count: 4}\n", "yaml"),
    ("zones: {dc-1: {region: a}}\nzones: {dc-2: {region: b}}\n", "yaml"),
], ids=["json", "yaml-flow", "yaml-block"])
def test_a_cluster_key_given_twice_is_refused(case, text, suffix):
    """JSON's and YAML's parsers keep the last of two equal keys: a count of 2 then 4 planned on 4."""
    (case / f"twice.{suffix}").write_text(text)
    check_refused(CLUSTER_CMD + [f"twice.{suffix}"], case)


# -- profiles: ours -------------------------------------------------------------------------
T = ("times", "1", "1")
M = ("memory", "1")
PROFILE_FIELDS = [
    (("format",), "str", False, None, None), (("version",), "int", False, 1, 1), (("gpu",), "str", True, None, None),
    (("precision",), "str", False, None, None), (("optimizer_s_per_param",), "number", True, 0, 1.0),
    (("runtime",), "str", False, None, None),
    (("times",), "object", True, None, None), (("times", "1"), "object", False, None, None),
    (T, "object", False, None, None), (T + ("fwd",), "list", True, None, None),
    (T + ("fwd", 0), "number", True, 0, 1e6), (T + ("bwd",), "list", True, None, None),
    (T + ("bwd", 3), "number", True, 0, 1e6), (("memory",), "object", True, None, None),
    (M, "object", True, None, None),
    (M + ("params",), "list", True, None, None), (M + ("params", 1), "int", True, 0, 10 ** 15),
    (M + ("activation_bytes", 2), "number", True, 0, 1e18), (M + ("output_bytes", 0), "number", True, 0, 1e18),
    (("model_config", "hidden"), "int", True, 1, 1 << 20),
    (("model_config", "vocab_divisor"), "int", False, 1, 1 << 24),
]
PROFILE_CASES = family(PROFILE_FIELDS, {
    "model-null": (("model",), None), "model-number": (("model",), 5), "model-empty": (("model",), ""),
    "unknown-key": (("timez",), {}), "mbs-key-x": (("times", "x"), {}), "mbs-key-zero": (("times", "0"), {}),
    "tp-key-x": (("times", "1", "x"), {"fwd": [], "bwd": []}), "memory-key-x": (("memory", "x"), {}),
    "fwd-short": (T + ("fwd",), [0.1]), "all-zero-times": (T, {"fwd": [0.0] * 6, "bwd": [0.0] * 6}),
    "params-short": (M + ("params",), [1, 2]), "times-empty": (("times",), {}),
    "precision-other": (("precision",), "fp8"), "runtime-other": (("runtime",), "deepspeed"), "layers-vs-model": (("times",), {"1": {"1": {"fwd": [0.1] * 7,
                                                                                              "bwd": [0.1] * 7}}}),
})


@pytest.mark.parametrize("name, path, value", PROFILE_CASES, ids=ids(PROFILE_CASES))
def test_profile_ours(case, name, path, value):
    doc = json.loads((case / "profiles/tiny/CPU/profile.json").read_text())
    if name.startswith("layers-vs-model"):
        doc["memory"] = {"1": {k: v + v[:1] for k, v in doc["memory"]["1"].items()}}
    _dump(case / "profiles/tiny/CPU/profile.json", _set(doc, path, value))
    check_refused(SIMULATE, case)


SHOW_SAMPLE = [c for c in PROFILE_CASES[::4] if c[0] != "memory.1=missing"]  # other TPs' facts are enough alone


@pytest.mark.parametrize("name, path, value", SHOW_SAMPLE, ids=ids(SHOW_SAMPLE))
def test_profile_ours_in_show_and_merge(case, name, path, value):
    doc = json.loads((case / "profiles/tiny/CPU/profile.json").read_text())
    if name.startswith("layers-vs-model"):
        return  # a profile of another shape is fine on its own
    _dump(case / "profiles/tiny/CPU/profile.json", _set(doc, path, value))
    check_refused(["profile", "show", "profiles"], case)
    check_refused(["profile", "merge", "profiles", "other", "-o", "merged"], case)


@pytest.mark.parametrize("field, value", [("gpu", "../../../ESCAPED"), ("gpu", ".."), ("gpu", "A100/40"),
                                          ("gpu", "A100\u0000"), ("model", ".."), ("model", ".")])
def test_profile_names_never_lead_out_of_the_output(case, field, value):
    """A profile's model and gpu become directories of merge's and export's output: a '..' or '/' in them wrote
    outside it (with --force over a source profile)."""
    doc = _set(json.loads((case / "profiles/tiny/CPU/profile.json").read_text()), (field,), value)
    _dump(case / "ev/tiny/CPU/profile.json", doc)
    for argv in (["profile", "merge", "ev", "other", "-o", "out/m"],
                 ["profile", "merge", "ev", "other", "-o", "out/m", "--force", "--prefer", "last"],
                 ["profile", "export", "ev", "-o", "out/x"], ["profile", "show", "ev"]):
        check_refused(argv, case)
    err = invoke(["profile", "merge", "ev", "other", "-o", "out/m"])[2]
    named = f"{field} must be printable" if "\0" in value else f"{field} {value!r} must be a "  # (NUL: at reading)
    assert f"profile ev/tiny/CPU/profile.json: {named}" in err, err


# -- network fits: ours and Sailor's providers/ -----------------------------------------------
NETWORK_FIELDS = [
    (("intra",), "list", False, None, None), (("intra", 0, "gpu"), "str", True, None, None),
    (("intra", 0, "gpus"), "int", True, 1, 1 << 16), (("intra", 0, "coeffs"), "list", True, None, None),
    (("intra", 0, "coeffs", 2), "number", True, None, 1e9),
    (("intra", 0, "max_bytes_per_s"), "number", True, 1e-9, 1e15), (("intra", 0, "latency_s"), "number", False, 0, 1e3),
    (("intra", 0, "min_bytes"), "number", False, 1e-9, 1e15),
    (("intra", 0, "allreduce_efficiency"), "number", False, 1e-9, 1e3), (("inter",), "list", False, None, None),
    (("inter", 0, "src_zone"), "str", True, None, None), (("inter", 0, "dst_gpus"), "int", True, 1, 1 << 16),
    (("inter", 0, "max_bytes_per_s"), "number", True, 1e-9, 1e15), (("allreduce",), "list", False, None, None),
]
NETWORK_CASES = [c for c in family(NETWORK_FIELDS, {
    "coeffs-two": (("intra", 0, "coeffs"), [1.0, 2.0]), "min-above-max": (("intra", 0, "min_bytes"), 1e9),
}) if not c[0].startswith(("intra.0.latency_s=null", "intra.0.min_bytes=null", "intra.0.allreduce_efficiency=null"))]


@pytest.mark.parametrize("name, path, value", NETWORK_CASES, ids=ids(NETWORK_CASES))
def test_network_file(case, name, path, value):
    _dump(case / "profiles/network.json", _set(NETWORK, path, value))
    check_refused(SIMULATE, case)


SAILOR_NET_CASES = [(f"intra-{n}", "intra_node_bandwidths.json", _set(SAILOR_INTRA, ("CPU", "2") + p, v))
                    for n, p, v in [("cap-neg", (1,), -1.0), ("cap-nan", (1,), NAN), ("coeffs-str", (0,), "x"),
                                    ("shape", (), [1.0]), ("coeff-null", (0, 1), None),
                                    ("cap-big-int", (1,), 10 ** 400), ("coeff-big-int", (0, 1), -10 ** 400)]] + \
    [(f"inter-{n}", "multizone_bandwidths_het.json", v) for n, v in [
        ("count-key", _set(SAILOR_INTER, ("local", "CPU"), {"x": {}})),
        ("count-key-superscript", _set(SAILOR_INTER, ("local", "CPU"), {"\u00b2": {}})),  # isdigit, not int()
        ("dst-count-key", _set(SAILOR_INTER, ("local", "CPU", "1", "local", "CPU"), {"0": [[0.0, 0.0, 1.0], 1e9]})),
        ("dst-count-key-superscript",
         _set(SAILOR_INTER, ("local", "CPU", "1", "local", "CPU"), {"\u00b2": [[0.0, 0.0, 1.0], 1e9]})),
        ("entry", _set(SAILOR_INTER, ("local", "CPU", "1", "local", "CPU", "1"), {"a": 1})),
        ("entry-cap-zero", _set(SAILOR_INTER, ("local", "CPU", "1", "local", "CPU", "1"), [[0.0, 0.0, 1.0], 0])),
        ("entry-coeff-bool", _set(SAILOR_INTER, ("local", "CPU", "1", "local", "CPU", "1"), [[0.0, True, 1.0], 1e9])),
        ("zone-level", _set(SAILOR_INTER, ("local", "CPU", "1"), [1])),
        ("top", [1, 2])]] + \
    [(f"intra-top-{n}", "intra_node_bandwidths.json", v) for n, v in [("list", [1]), ("gpus-key", {"CPU": {"two": 1}})]]


@pytest.mark.parametrize("name, file, doc", SAILOR_NET_CASES, ids=[c[0] for c in SAILOR_NET_CASES])
def test_sailor_network_files(case, name, file, doc):
    _dump(case / "sailor-profiles/providers" / file, doc)
    check_refused(SIMULATE[:2] + ["--profiles", "sailor-profiles"], case)


# -- profiles: Sailor's layout ---------------------------------------------------------------
INFO = ("tiny", "1", "0")
SAILOR_PROFILE_CASES = [
    *[(f"llm_info.{k}={n}", "llm_info.json", INFO + (k,), v) for k in ("params_floats", "act_mem_floats")
      for n, v in bad_values("number", True, 0, 1e18).items() if k == "act_mem_floats" or n != "missing"],
    ("llm_info.tp-key", "llm_info.json", ("tiny", "x"), {}), ("llm_info.model", "llm_info.json", ("tiny",), [1]),
    ("llm_info.layer", "llm_info.json", INFO, "x"), ("llm_info.top", "llm_info.json", (), [1]),
    *[(f"profile.layer[0]={n}", "profiles/tiny/CPU/profile.json", ("1", "1", "0", 0), v)
      for n, v in bad_values("number", True, 0, 1e6).items()],
    ("profile.layer-short", "profiles/tiny/CPU/profile.json", ("1", "1", "0"), [0.1, 0.2]),
    ("profile.mbs-key", "profiles/tiny/CPU/profile.json", ("x",), {}),
    ("profile.mbs-key-superscript", "profiles/tiny/CPU/profile.json", ("\u00b2",), {}),
    ("profile.layer-int-text", "profiles/tiny/CPU/profile.json", ("1", "1", "0", 1), "0.5"),
    ("profile.layer-row-dict", "profiles/tiny/CPU/profile.json", ("1", "1", "0"), {"a": 1, "b": 2, "c": 3}),
    ("profile.tp-key", "profiles/tiny/CPU/profile.json", ("1", "0"), {}),
    ("profiles_tmp.layer", "profiles/profiles_tmp.json", ("tiny", "CPU", "1", "1", "0", 1), -5.0),
    ("profiles_tmp.model", "profiles/profiles_tmp.json", ("tiny",), [1]),
    ("profiles_tmp.gpu", "profiles/profiles_tmp.json", ("tiny", "CPU"), "x"),
]


@pytest.mark.parametrize("name, file, path, value", SAILOR_PROFILE_CASES, ids=[c[0] for c in SAILOR_PROFILE_CASES])
def test_profile_sailor_layout(case, name, file, path, value):
    target = case / "sailor-profiles" / file
    doc = json.loads(target.read_text())
    _dump(target, value if path == () else _set(doc, path, value))
    check_refused(SIMULATE[:2] + ["--profiles", "sailor-profiles"], case)


# -- Hugging Face config.json --------------------------------------------------------------------
HF_FIELDS = [
    (("model_type",), "str", True, None, None), (("hidden_size",), "int", True, 1, 1 << 20),
    (("intermediate_size",), "int", True, 1, 1 << 22), (("num_hidden_layers",), "int", True, 1, 4096),
    (("num_attention_heads",), "int", True, 1, 1 << 16), (("vocab_size",), "int", True, 1, 1 << 24),
    (("max_position_embeddings",), "int", True, 1, 1 << 30),
]
HF_OPTIONAL = [  # optional fields: null means "the default", so only values of the wrong kind are wrong
    (("num_key_value_heads",), "int", 1), (("rms_norm_eps",), "number", 1e-30), (("rope_theta",), "number", 1e-30),
    (("tie_word_embeddings",), "bool", None), (("hidden_act",), "str", None),
]
HF_CASES = family(HF_FIELDS) + [
    (f"{p[0]}={n}", p, v) for p, kind, lo in HF_OPTIONAL for n, v in bad_values(kind, False, lo, None).items()
    if n != "null"] + [
    ("model_type-bert", ("model_type",), "bert"), ("heads-not-dividing", ("num_attention_heads",), 3),
    ("kv-heads-not-dividing", ("num_key_value_heads",), 3), ("act-unknown", ("hidden_act",), "swishy"),
    ("layers-million", ("num_hidden_layers",), 10 ** 6), ("rope-type", ("rope_scaling",), {"rope_type": "yarn"}),
    ("rope-params", ("rope_parameters",), "x"), ("rope-factor", ("rope_scaling",), {"rope_type": "linear"}),
    ("pad-token", ("pad_token_id",), -3),
    # (on Mistral: LLaMA's blocks attend to every token, whatever layer_types says)
    ("windows", (), {**HF_CONFIG, "model_type": "mistral", "layer_types": ["sliding_attention"]}),
    ("rope-scaling-str", ("rope_scaling",), "linear"), ("rope-scaling-list", ("rope_scaling",), ["linear", 2.0]),
    ("layer-types-number", (), {**HF_CONFIG, "model_type": "mistral", "layer_types": 5}),
    ("layers-1e308", ("num_hidden_layers",), 1e308),
    ("name-long", ("_name_or_path",), "n" * 1001), ("name-surrogate", ("_name_or_path",), "m\ud800"),
    ("name-line-break", ("_name_or_path",), "org/m\nx"),
    *[(f"neo-repeat-{n}", (), _set(NEO_CONFIG, ("attention_types", 0, 1), v)) for n, v in (
        ("1e300", 1e300), ("1e9", 10 ** 9), ("string", "2"), ("fraction", 2.5), ("float", 2.0), ("zero", 0),
        ("negative", -1), ("bool", True), ("beyond-layers", 5))],
]


@pytest.mark.parametrize("name, path, value", HF_CASES, ids=ids(HF_CASES))
def test_hf_config(case, name, path, value):
    _dump(case / "config.json", value if path == () else _set(HF_CONFIG, path, value))
    check_refused(["plan", "--model", "config.json", "--gpus", "CPU@local=2", "--global-batch", "8", "-o", "out.json"],
                  case)


# -- traces ----------------------------------------------------------------------------------------
TRACE_CASES = family([(("0", "Time"), "number", True, 0, 1e12), (("0", "GPUs"), "int", True, 0, 1 << 20)])
TRACE_CASES = [(n, (0,) + p[1:], v) for n, p, v in TRACE_CASES] + [
    ("top-object", (), {"Time": 0}), ("top-empty", (), []), ("entry-list", (0,), [0, 2]),
    ("extra-key", (0, "Zone"), "local")]


@pytest.mark.parametrize("name, path, value", TRACE_CASES, ids=ids(TRACE_CASES))
def test_trace_json(case, name, path, value):
    _dump(case / "trace.json", value if path == () else _set(TRACE, path, value))
    check_refused(["replay", "trace.json", *REPLAY[1:]], case)


CSV_CASES = {
    "header-only": ",Timestamp,CPU_local\n", "no-columns": ",Timestamp\n0,1\n",
    "no-index-column": "Timestamp,CPU_local,CPU_local\n100,2,2\n", "time-column-renamed": ",Time,CPU_local\n0,1,2\n",
    "short-row": ",Timestamp,CPU_local\n0,1\n",
    "long-row": ",Timestamp,CPU_local\n0,1,2,3\n", "time-text": ",Timestamp,CPU_local\n0,noon,2\n",
    "time-nan": ",Timestamp,CPU_local\n0,nan,2\n", "time-inf": ",Timestamp,CPU_local\n0,inf,2\n",
    "count-negative": ",Timestamp,CPU_local\n0,1,-2\n", "count-fraction": ",Timestamp,CPU_local\n0,1,2.5\n",
    "count-huge": ",Timestamp,CPU_local\n0,1,1e12\n", "count-text": ",Timestamp,CPU_local\n0,1,two\n",
    "gpu-unknown": ",Timestamp,B300_local\n0,1,2\n", "zone-unknown": ",Timestamp,CPU_mars-1\n0,1,2\n",
    "back-in-time": ",Timestamp,CPU_local\n0,100,2\n1,50,2\n",
    "back-in-time-later": ",Timestamp,CPU_local\n0,100,2\n1,200,2\n2,150,2\n",
    "field-too-long": ",Timestamp,CPU_local\n0,0," + "2" * 140000 + "\n",
    "time-arabic-digit": ",Timestamp,CPU_local\n0,\u0663,2\n", "count-underscore": ",Timestamp,CPU_local\n0,1,1_0\n",
    # long values are quoted short in the message
    "count-401-digits": ",Timestamp,CPU_local\n0,1," + "9" * 401 + "\n",
    "zone-long": ",Timestamp,CPU_" + "z" * 100000 + "\n0,1,2\n", "gpu-long": ",Timestamp," + "G" * 100000 + "_local\n0,1,2\n",
}


@pytest.mark.parametrize("name", CSV_CASES)
def test_trace_csv(case, name):
    _dump(case / "trace.csv", CSV_CASES[name])
    check_refused(["replay", "trace.csv", "--model", "tiny", "--global-batch", "8", "--policies", "sailor"], case)


# -- every file kind as a whole ----------------------------------------------------------------------
CORRUPT = {"empty": b"", "blank": b"  \n", "not-utf8": b"\xff\xfe\x00\x81 bytes", "binary": bytes(range(256)),
           "truncated": None, "top-list": b"[1, 2]", "top-number": b"42", "top-string": b'"plan"',
           "nan-literal": None, "deep": b"[" * 100000 + b"]" * 100000, "directory": None,
           "int-5000-digits": b"[1" + b"0" * 5000 + b"]", "self-alias": b"available: &x [*x]\n"}
FILE_KINDS = {  # file, command that reads it
    "plan": ("plan.json", SIMULATE), "plan-launch": ("plan.json", ["launch", "plan.json"]),
    "sailor-plan": ("sailor_plan.json", ["simulate", "sailor_plan.json"]),
    "cluster-json": ("cluster.json", CLUSTER_CMD + ["cluster.json"]),
    "cluster-yaml": ("cluster.yaml", CLUSTER_CMD + ["cluster.yaml"]),
    "profile": ("profiles/tiny/CPU/profile.json", SIMULATE), "network": ("profiles/network.json", SIMULATE),
    "llm-info": ("sailor-profiles/llm_info.json", SIMULATE[:2] + ["--profiles", "sailor-profiles"]),
    "sailor-profile": ("sailor-profiles/profiles/tiny/CPU/profile.json",
                       SIMULATE[:2] + ["--profiles", "sailor-profiles"]),
    "sailor-network": ("sailor-profiles/providers/intra_node_bandwidths.json",
                       SIMULATE[:2] + ["--profiles", "sailor-profiles"]),
    "hf-config": ("config.json", ["plan", "--model", "config.json", "--gpus", "CPU@local=2", "--global-batch", "8",
                                  "-o", "out.json"]),
    "trace-json": ("trace.json", ["replay", "trace.json", *REPLAY[1:]]),
    "trace-csv": ("trace.csv", REPLAY_CSV),
    "profile-show": ("profiles/tiny/CPU/profile.json", ["profile", "show", "profiles"]),
}
WHOLE_FILE_CASES = [(kind, how) for kind in FILE_KINDS for how in CORRUPT
                    if not (kind == "trace-csv" and how in ("top-list", "top-number", "nan-literal", "deep",
                                                            "top-string", "int-5000-digits"))
                    and (how != "self-alias" or kind == "cluster-yaml")  # YAML only
                    and not (kind == "cluster-yaml" and how == "truncated")]  # half a YAML file may be a valid one


@pytest.mark.parametrize("kind, how", WHOLE_FILE_CASES, ids=[f"{k}-{h}" for k, h in WHOLE_FILE_CASES])
def test_whole_file(case, kind, how):
    file, argv = FILE_KINDS[kind]
    target = case / file
    text = target.read_bytes()
    if how == "directory":
        target.unlink()
        target.mkdir()
        (target / "x").write_text("x")
    elif how == "truncated":
        target.write_bytes(text[:len(text) // 2])
    elif how == "nan-literal":
        target.write_bytes(text.replace(b"8", b"NaN", 1) if b"8" in text else b"[NaN]")
    else:
        target.write_bytes(CORRUPT[how])
    check_refused(argv, case)


# -- flags ---------------------------------------------------------------------------------------------
NUMBERS = {"zero": "0", "negative": "-1", "nan": "nan", "inf": "inf", "huge": "1e300", "text": "x", "empty": "",
           "fraction": "1.5", "big-int": "99999999999999999999"}


def flag_family(base: list[str], flag: str, positive: bool = True, integer: bool = True, skip=()) -> list:
    out = []
    for name, text in NUMBERS.items():
        if name in skip or (name == "zero" and not positive) or (name == "fraction" and not integer):
            continue
        if name == "big-int" and not integer:
            continue
        out.append((f"{base[0]} {flag}={name}", base + [flag, text]))
    return out


FLAG_CASES = [
    *[c for f in ("--global-batch", "--seq-length", "--top", "--max-stages", "--max-gpus")
      for c in flag_family(PLAN_CMD, f)],
    *[c for f in ("--max-cost-per-iter", "--max-cost-per-hour", "--min-throughput")
      for c in flag_family(PLAN_CMD, f, integer=False)],
    *[(f"plan --microbatch-sizes={v}", PLAN_CMD + ["--microbatch-sizes", v]) for v in
      ("1,,2", "0", "x", "-2", "", "1.5", "2,", "99999999999")],
    *[(f"plan --gpus={v}", ["plan", "--model", "tiny", "--gpus", v, "-o", "out.json"]) for v in
      ("", " ", ",", "A100-40", "A100-40@=2", "@us-central1-a=2", "=2", "B300=4", "A100-40@mars-1=2",
       "A100-40@us-centrl1-a=2", "A100-40=-1", "A100-40=1e12", "A100-40=nan", "A100-40=99999999999",
       "A100-40=4,,V100-16=4", "A100-40=4=4", "A100-40=", "a100-40@local=x", "CPU@local=\u00b2")],
    *[(f"plan {f}={v}", PLAN_CMD + [f, v]) for f, v in (
        ("--objective", "speed"), ("--recompute", "sometimes"), ("--format", "yaml"), ("--runtime", "deepspeed"),
        ("--precision", "fp8"), ("--plot", "x.xyz"), ("--plot", "x"), ("--plot", "profiles"), ("--plot", "out.json"),
        ("-o", "profiles"), ("-o", "missing/dir/x.json"), ("-o", ""), ("--profiles", "missing"),
        ("--profiles", "plan.json"), ("--profiles", "ckpt/empty"), ("--profiles", ""), ("--cluster", "missing.yaml"),
        ("--cluster", "profiles"), ("--cluster", ""), ("--model", "gpt-9"), ("--model", ""),
        ("--model", "missing.json"), ("--model", "profiles"), ("--bogus", "1"))],
    ("plan -o=cluster", CLUSTER_CMD + ["cluster.yaml", "-o", "cluster.yaml"]),
    ("plan -o=-", PLAN_CMD[:-1] + ["-"]), ("plan -o=dir/", PLAN_CMD[:-1] + ["out.json/"]),
    ("launch -o=-", ["launch", "plan.json", "-o", "-"]),
    ("plan -o=config", ["plan", "--model", "config.json", "--gpus", "CPU@local=2", "-o", "config.json"]),
    ("plan -o=profile", PLAN_CMD[:-1] + ["profiles/tiny/CPU/profile.json", "--profiles", "profiles"]),
    ("plan no-model", ["plan", "--gpus", "CPU@local=2"]),
    ("plan infeasible", ["plan", "--model", "llama-3-8b", "--gpus", "CPU@local=2", "-o", "out.json"]),
    *[c for f in ("--seq-length",) for c in flag_family(SIMULATE, f)],
    *[(f"simulate {f}={v}", SIMULATE + [f, v]) for f, v in (
        ("--plot", "x.xyz"), ("--plot", "plan.json"), ("--runtime", "x"), ("--model", "gpt-9"), ("--seq-length", "32"),
        ("--precision", "fp8"), ("--cluster", "missing.yaml"))],
    ("simulate missing-plan", ["simulate", "missing.json"]), ("simulate plan-dir", ["simulate", "profiles"]),
    ("simulate no-plan", ["simulate"]), ("simulate two-plans", ["simulate", "plan.json", "plan.json"]),
    *[c for f in ("--global-batch", "--seq-length") for c in flag_family(["replay", "trace.json", *REPLAY[1:]], f)],
    *[c for c in flag_family(["replay", "trace.json", *REPLAY[1:]], "--restart-s", positive=False, integer=False)],
    *[(f"replay {f}={v}", ["replay", "trace.json", *REPLAY[1:], f, v]) for f, v in (
        ("--policies", "bogus"), ("--policies", ""), ("--policies", "sailor,,static"), ("--policies", "sailor,sailor"),
        ("--gpu", "B300"), ("--zone", "mars-1"), ("--objective", "x"), ("--plot", "r.txt"))],
    ("replay missing-trace", ["replay", "missing.json", "--model", "tiny"]),
    ("replay csv-with-gpu", ["replay", "trace.csv", *REPLAY[1:]]),  # (ignored: a CSV trace names its own)
    ("replay csv-with-zone", [*REPLAY_CSV, "--zone", "local"]),
    ("replay trace-dir", ["replay", "profiles", "--model", "tiny"]),
    *[(f"launch --master-port={v}", ["launch", "plan.json", "--master-port", v])
      for v in ("70000", "-1", "x", "", "0")],
    *[(f"launch {n}", a) for n, a in (
        ("-o=plan", ["launch", "plan.json", "--target", "slurm", "-o", "plan.json"]),
        ("-o=cluster", ["launch", "plan.json", "--cluster", "cluster.json", "-o", "cluster.json"]),
        ("-o=dir", ["launch", "plan.json", "-o", "profiles"]), ("-o=missing-dir", ["launch", "plan.json", "-o", "a/b"]),
        ("-o=empty", ["launch", "plan.json", "-o", ""]),
        # nor over what the ranks read or write: their metrics, data files, checkpoint directory
        ("-o=metrics-file", ["launch", "plan.json", "-o", "m.jsonl", "--", "--metrics-file", "m.jsonl"]),
        ("-o=data", ["launch", "plan.json", "-o", "data.bin", "--", "--data-path", "data"]),
        ("-o=in-load", ["launch", "plan.json", "--target", "slurm", "-o", "profiles/tiny/CPU/profile.json", "--",
                        "--load", "profiles"]),
        ("data-path-weight-only", ["launch", "plan.json", "--", "--data-path", "0.5"]),
        ("split-nan", ["launch", "plan.json", "--", "--split", "nan"]),
        ("target", ["launch", "plan.json", "--target", "mpi"]), ("unknown-option", ["launch", "plan.json", "--bogus"]),
        ("late-bad-port", ["launch", "plan.json", "--master-port", "1", "--", "--train-iters", "1"][:4] +
         ["--target", "slurm", "--master-port", "99999"]),
        ("missing-plan", ["launch", "missing.json"]),
        ("cluster-missing", ["launch", "plan.json", "--cluster", "x.yaml"]),
        ("master-addr-command", ["launch", "plan.json", "--master-addr", "$(touch x); y"]),
        ("master-addr-two-variables", ["launch", "plan.json", "--master-addr", "$A$B"]),
        ("master-addr-empty", ["launch", "plan.json", "--master-addr", ""]),
        ("master-addr-slurm", ["launch", "plan.json", "--target", "slurm", "--master-addr", "head"]),
        ("train-plan=", ["launch", "plan.json", "--", "--plan=other.json"]),
        ("train-cluster=", ["launch", "plan.json", "--", "--cluster=cluster.yaml"]))],
]
RUN_CASES = [
    *[c for f in ("--global-batch", "--gpus-per-node", "--heartbeat-misses", "--max-tp", "--seq-length")
      for c in flag_family(RUN, f, skip=("big-int",))],
    *[c for f in ("--heartbeat-s", "--wait-s", "--nodes-interval-s", "--worker-stall-s")
      for c in flag_family(RUN, f, integer=False)],
    *[(f"run --state={v}", RUN + ["--state", v]) for v in
      ("etcd://bad", "etcd://127.0.0.1/job", "etcd://127.0.0.1:1/a/b", "etcd://127.0.0.1:1/job", "/proc/none/j")],
    *[c for c in flag_family(RUN, "--reconfigure-cost-s", positive=False, integer=False)],
    *[(f"run --port={v}", RUN + ["--port", v]) for v in ("70000", "-1", "x", "")],
    *[(f"run {n}", a + TRAIN) for n, a in (
        ("max-tp-3", RUN + ["--max-tp", "3"]), ("seq-beyond-context", RUN + ["--seq-length", "65"]),
        ("gpus-zone", RUN[:6] + ["CPU@mars-1=6"] + RUN[7:]), ("gpus-empty", RUN[:6] + [""] + RUN[7:]),
        ("local-without-gpus", RUN[:5] + RUN[7:]), ("gpus-per-node-without-local", RUN[:-1]),
        ("load-missing", RUN + ["--load", "nowhere"]), ("no-plan-fits", ["run", "--model", "llama-3-8b",
                                                                         *RUN[3:]]),
        ("model-unknown", ["run", "--model", "gpt-9", *RUN[3:]]),
        ("events-file-dir", RUN + ["--events-file", "profiles"]),
        ("address-file-missing-dir", RUN + ["--address-file", "a/b"]), ("objective", RUN + ["--objective", "x"]),
        ("cluster-missing", RUN + ["--cluster", "x.yaml"]), ("profiles-missing", RUN + ["--profiles", "nowhere"]))],
    ("run no-train-args", RUN), ("run no-train-iters", RUN + ["--", "--lr", "0.1"]),
    ("run train-iters-text", RUN + ["--", "--train-iters", "x"]),
    ("run train-iters-zero", RUN + ["--", "--train-iters", "0"]),
    ("run train-plan", RUN + TRAIN + ["--plan", "p.json"]), ("run train-unknown", RUN + TRAIN + ["--bogus"]),
    ("run train-model", RUN + TRAIN + ["--model", "opt-125m"]),
    ("run stray-arg", RUN + ["stray", "--", "--train-iters", "1"]),
    ("run missing-batch", ["run", "--model", "tiny", "--local", *TRAIN]),
    # the job's own files never land on what it or its workers read or write
    ("run events-file=model", ["run", "--model", "config.json", *RUN[3:], "--events-file", "config.json", *TRAIN]),
    ("run address-file=save", RUN + ["--address-file", "ckpt-new", *TRAIN, "--save", "ckpt-new"]),
    ("run events-file=metrics", RUN + ["--events-file", "m.jsonl", *TRAIN, "--metrics-file", "m.jsonl"]),
    ("run events-file=address-file", RUN + ["--events-file", "x", "--address-file", "x"]),
    ("run events-file-empty", RUN + ["--events-file", ""]), ("run address-file-empty", RUN + ["--address-file", ""]),
    ("run nodes-file-and-command", RUN + ["--nodes-file", "plan.json", "--nodes-command", "true"]),
]
RUN_CASES = [(n, a if "--" in a or "no-train" in n else a + TRAIN) for n, a in RUN_CASES]
AGENT_CASES = [
    *[(f"agent --store={v}", ["agent", "--store", v, "--gpus", "CPU@local=2"]) for v in
      ("x", "host:0", "host:70000", "host:", ":x", "", "host:\u00b2")],
    *[(f"agent --gpus={v}", ["agent", "--store", "127.0.0.1:1", "--gpus", v]) for v in
      ("", "CPU@mars-1=2", "CPU@local=2,A100-40@local=2", "B300=2", "CPU@local=0")],
    *[c for f in ("--heartbeat-s",) for c in flag_family(["agent", "--store", "127.0.0.1:1", "--gpus", "CPU@local=2"],
                                                          f, integer=False)],
    *[(f"agent --store={v}", ["agent", "--store", v, "--gpus", "CPU@local=2"]) for v in
      ("etcd://bad", "etcd://127.0.0.1:1/")],
    *[c for c in flag_family(["agent", "--store", "127.0.0.1:1", "--gpus", "CPU@local=2"], "--controller-wait-s",
                             positive=False, integer=False)],
    ("agent --max-restarts=-1", ["agent", "--store", "127.0.0.1:1", "--gpus", "CPU@local=2", "--max-restarts", "-1"]),
    ("agent node-id", ["agent", "--store", "127.0.0.1:1", "--gpus", "CPU@local=2", "--node-id", "a/b"]),
]
PROFILE_MODEL = ["profile", "model", "--model", "tiny", "--device", "cpu", "-o", "new-profiles"]
PROFILE_CASES_FLAGS = [
    *[(f"profile model {f}={v}", PROFILE_MODEL + [f, v]) for f, v in (
        ("--micro-batch-sizes", "0"), ("--micro-batch-sizes", "1,,2"), ("--micro-batch-sizes", "x"),
        ("--tp", "0"), ("--tp", "1,x"), ("--tp", "128"), ("--repeats", "0"), ("--warmup", "-1"), ("--blocks", "0"),
        ("--threads", "0"), ("--concurrency", "0"), ("--timeout", "0"), ("--timeout", "nan"), ("--seed", "-1"),
        ("--model", "gpt-9"), ("--device", "tpu"), ("--precision", "fp8"), ("-o", "plan.json"))],
    *[(f"profile network {f}={v}", ["profile", "network", "-o", "net.json", "--local", "2", f, v]) for f, v in (
        ("--min-size", "1XB"), ("--min-size", "-1KB"), ("--min-size", ""), ("--max-size", "512KB"),
        ("--max-size", "99999999999999999PB"), ("--local", "1"), ("--local", "0"), ("--compute-between", "-1"),
        ("--compute-between", "nan"), ("--timeout", "0"), ("--nodes", "0,1,2"), ("--nodes", "a,b"),
        ("--zones", "z"), ("--local", "x"))],
    ("profile network no-local", ["profile", "network", "-o", "net.json"]),
    *[(f"profile show {n}", ["profile", "show", *a]) for n, a in (
        ("missing", ["nowhere"]), ("file", ["plan.json"]), ("empty", ["ckpt/empty"]),
        ("filter", ["profiles", "--model", "opt-125m"]), ("gpu-filter", ["profiles", "--gpu", "B300"]))],
    *[(f"profile merge {n}", ["profile", "merge", *a]) for n, a in (
        ("one", ["profiles", "-o", "m"]), ("into-source", ["profiles", "other", "-o", "profiles"]),
        ("into-child", ["profiles", "other", "-o", "profiles/sub"]), ("occupied", ["profiles", "sailor-profiles",
                                                                                  "-o", "other"]),
        ("into-file", ["profiles", "other", "-o", "plan.json"]), ("prefer", ["profiles", "other", "-o", "m",
                                                                              "--prefer", "x"]),
        ("missing", ["profiles", "nowhere", "-o", "m"]), ("conflict", ["profiles", "sailor-profiles", "-o", "m"]))],
    *[(f"profile export {n}", ["profile", "export", *a]) for n, a in (
        ("into-source", ["profiles", "-o", "profiles"]), ("into-file", ["profiles", "-o", "plan.json"]),
        ("network-only", ["ckpt/empty", "-o", "x"]), ("format", ["profiles", "-o", "x", "--format", "csv"]))],
]
EXPORT_CASES = [
    *[(f"export {name}", ["export", f"ckpt/{name}", "--to-hf", "hf-out"]) for name in (
        "empty", "dangling", "badmeta", "foreign", "binarymeta", "garbage-rank", "no-rank", "hf-model", "checksum",
        "a-file", "nowhere", "wrong-pieces", "foreign-tensor", "not-a-list", "no-step", "bad-model", "unknown-model",
        "no-tensors")],
    *[(f"export --max-shard-size={v}", ["export", "ckpt/empty", "--to-hf", "hf-out", "--max-shard-size", v])
      for v in ("0", "-1", "x", "", "1e3", "5XB")],
    ("export into-checkpoint", ["export", "ckpt/garbage-rank", "--to-hf", "ckpt/garbage-rank/hf"]),
    ("export onto-parent", ["export", "ckpt/garbage-rank", "--to-hf", "ckpt"]),
    ("export to-file", ["export", "ckpt/garbage-rank", "--to-hf", "plan.json"]),
    ("export occupied", ["export", "ckpt/garbage-rank", "--to-hf", "ckpt/hf-model"]),
    ("export dtype", ["export", "ckpt/garbage-rank", "--to-hf", "x", "--dtype", "int8"]),
    ("export tokenizer", ["export", "ckpt/garbage-rank", "--to-hf", "x", "--tokenizer", "nowhere"]),
    ("export tokenizer-empty", ["export", "ckpt/garbage-rank", "--to-hf", "x", "--tokenizer", ""]),
    ("export tokenizer-no-files", ["export", "ckpt/garbage-rank", "--to-hf", "x", "--tokenizer", "ckpt"]),
]
OTHER_CASES = [
    ("no-command", []), ("unknown-command", ["bogus"]), ("unknown-flag", ["--bogus"]), ("plan-typo", ["plna"]),
    ("list-bogus", ["list", "bogus"]), ("list-cluster", ["list", "gpus", "--cluster", "x.yaml"]),
    ("list-bad-cluster", ["list", "zones", "--cluster", "plan.json"]),
]
ALL_FLAG_CASES = FLAG_CASES + RUN_CASES + AGENT_CASES + PROFILE_CASES_FLAGS + OTHER_CASES


@pytest.mark.parametrize("name, argv", ALL_FLAG_CASES, ids=[c[0] for c in ALL_FLAG_CASES])
def test_flags(case, name, argv):
    if name == "profile merge occupied":  # a merge may not overwrite what the output already holds
        shutil.copytree(case / "profiles", case / "merge-target")
        argv = ["profile", "merge", "profiles", "other", "-o", "merge-target"]
    check_refused(argv, case)


@pytest.mark.parametrize("argv", [PLAN_CMD[:-1] + ["special"], ["launch", "plan.json", "-o", "special"],
                                  RUN + ["--address-file", "special"] + TRAIN, RUN + ["--state", "special"] + TRAIN],
                         ids=["plan -o", "launch -o", "run --address-file", "run --state"])
def test_an_output_never_replaces_a_device_or_pipe(case, argv):
    """An output is renamed over its path: as root, `sailor run --address-file /dev/full` put a file in the
    device's place. (A pipe stands in for the device here.)"""
    os.mkfifo(case / "special")
    check_refused(argv, case)
    assert stat.S_ISFIFO((case / "special").lstat().st_mode)


@pytest.mark.parametrize("argv", [["simulate", "pipe"], ["launch", "pipe"], PLAN_CMD[:2] + ["pipe"] + PLAN_CMD[3:],
                                  CLUSTER_CMD + ["pipe"]], ids=["plan", "launch", "model", "cluster"])
def test_an_input_pipe_that_nothing_writes_to_is_refused(case, argv):
    """A named pipe as an input file, with no writer: opening it waited forever."""
    os.mkfifo(case / "pipe")
    check_refused(argv, case)


@pytest.mark.parametrize("argv", [["export", "ckpt/garbage-rank", "--to-hf", ""],
                                  ["profile", "merge", "profiles", "other", "-o", ""]], ids=["export", "profile merge"])
def test_an_empty_output_directory_is_refused_as_empty(case, argv):
    """'' was the current directory: export wrote the model there, merge the profiles."""
    check_refused(argv, case)
    assert "is empty; give a directory" in invoke(argv)[2]


@pytest.mark.parametrize("name, argv", EXPORT_CASES, ids=[c[0] for c in EXPORT_CASES])
def test_export(case, name, argv):
    pytest.importorskip("torch")
    check_refused(argv, case)


def test_suite_size():
    """The contract is checked on at least 200 malformed invocations (it is far more)."""
    n = (len(PLAN_CASES) + len(LAUNCH_SAMPLE) + len(SAILOR_PLAN_CASES) + len(CLUSTER_CASES) + len(PROFILE_CASES)
         + 2 * len(SHOW_SAMPLE) + len(NETWORK_CASES) + len(SAILOR_NET_CASES) + len(SAILOR_PROFILE_CASES)
         + len(HF_CASES) + len(TRACE_CASES) + len(CSV_CASES) + len(WHOLE_FILE_CASES) + len(ALL_FLAG_CASES)
         + len(EXPORT_CASES))
    assert n >= 200, n


# -- the valid inputs work, and what reaches a real terminal ---------------------------------------
@pytest.mark.parametrize("argv", [
    SIMULATE, ["simulate", "sailor_plan.json"], CLUSTER_CMD + ["cluster.yaml"], CLUSTER_CMD + ["cluster.json"],
    SIMULATE[:2] + ["--profiles", "sailor-profiles"], ["plan", "--model", "config.json", "--gpus", "CPU@local=2",
                                                        "--global-batch", "8", "-o", "out.json"],
    ["replay", "trace.json", *REPLAY[1:]], REPLAY_CSV, ["launch", "plan.json"],
    ["profile", "show", "profiles"], ["profile", "show", "sailor-profiles"], ["list", "gpus"],
], ids=lambda a: " ".join(a[:3]))
def test_the_valid_inputs_work(case, argv):
    code, out, err, _ = invoke(argv)
    assert code == 0, err


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "tiny", "--gpus", "CPU@local=2", "--top", "0"],
    ["simulate", "plan.json", "--profiles", "profiles"],  # with a truncated plan, below
    ["run", "--model", "tiny", "--global-batch", "12", "--port", "70000", "--", "--train-iters", "5"],
    ["run", "--model", "tiny", "--global-batch", "12", "--gpus", "CPU@local=2", "--local"],
    ["replay", "trace.csv", "--model", "tiny"],  # with a non-UTF-8 trace, below
    ["list", "zones", "--cluster", "surrogate.json"],  # a zone named with a lone \ud800, which stdout cannot print
])
def test_no_traceback_reaches_the_terminal(workspace, tmp_path, argv):
    work = tmp_path / "w"
    shutil.copytree(workspace, work)
    (work / "plan.json").write_text(json.dumps(PLAN)[:40])
    (work / "trace.csv").write_bytes(b"\xff\xfe,Timestamp\n")
    (work / "surrogate.json").write_text('{"zones": {"z\\ud800": {"region": "x"}}}')
    env = {k: v for k, v in os.environ.items() if k != "SAILOR_PROFILES"}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "planner.cli", *argv], cwd=work, capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 2 and out.stdout == "" and time.monotonic() - start < 10
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("sailor: error: ") and "Traceback" not in out.stderr


def test_an_internal_error_says_it_is_a_bug(case, monkeypatch):
    import planner.search.planner as planner

    monkeypatch.setattr(planner.Planner, "run", lambda *a, **k: 1 / 0)
    code, out, err, _ = invoke(PLAN_CMD)
    assert code == 1 and err.count("\n") == 1 and "internal error: ZeroDivisionError" in err and "a bug" in err
    assert "Traceback" not in err


def test_a_closed_pipe_is_quiet(workspace):
    out = subprocess.run(f"{sys.executable} -m planner.cli list gpus | head -c 10", shell=True, capture_output=True,
                         text=True, cwd=workspace, timeout=60)
    assert out.returncode == 0 and out.stderr == ""


def test_a_closed_stdout_is_quiet(case):
    """Started with stdout closed (`>&-`): what it would print goes nowhere; files are still written."""
    for argv in ("list gpus", " ".join(PLAN_CMD)):
        out = subprocess.run(f"{sys.executable} -m planner.cli {argv} >&-", shell=True, capture_output=True,
                             text=True, cwd=case, timeout=60)
        assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)
    assert (case / "out.json").exists()


def test_launch_files_never_replace_inputs(case):
    """-o p.json for several SkyPilot groups writes p-0.json, p-1.json...: none of them may be an input."""
    plan = {"model": "tiny", "global_batch_size": 8, "stages": [{"layers": [0, 5], "replicas": [
        {"gpu": "A100-40", "tp": 1, "zone": "us-central1-a"}, {"gpu": "H100-80", "tp": 1, "zone": "us-west1-b"}]}],
        "pipelines": [{"microbatch_size": 1, "num_microbatches": 4, "count": 2}]}
    _dump(case / "p-0.json", plan)
    _dump(case / "c-1.yaml", {"gpus": {}})
    check_refused(["launch", "p-0.json", "--target", "skypilot", "-o", "p.json"], case)
    over_cluster = ["launch", "p-0.json", "--cluster", "c-1.yaml", "--target", "skypilot", "-o", "c.yaml"]
    check_refused(over_cluster, case)
    assert "(from -o c.yaml) c-1.yaml is also an input" in invoke(over_cluster)[2]
    code, _, err, _ = invoke(["launch", "p-0.json", "--target", "skypilot", "-o", "sky.yaml"])
    assert code == 0 and (case / "sky-1.yaml").exists(), err


def test_launch_refuses_a_precision_simulate_refuses(case):
    """bf16 on V100s: the same one line from launch as from simulate, not a --bf16 for the runtime."""
    plan = copy.deepcopy(PLAN)
    plan["precision"] = "bf16"
    for stage in plan["stages"]:
        for r in stage["replicas"]:
            r.update(gpu="V100-16", zone="us-central1-a")
    _dump(case / "plan.json", plan)
    check_refused(["simulate", "plan.json"], case)
    check_refused(["launch", "plan.json"], case)
    assert invoke(["launch", "plan.json"])[2] == invoke(["simulate", "plan.json"])[2]


def test_outputs_are_atomic_and_never_replace_inputs(case, monkeypatch):
    """A write that fails half-way leaves the previous plan; a merge never overwrites without --force."""
    import planner.outputs as outputs

    assert invoke(PLAN_CMD)[0] == 0
    before = (case / "out.json").read_bytes()

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    real = os.replace
    monkeypatch.setattr(outputs.os, "replace", broken)
    code, _, err, _ = invoke(PLAN_CMD + ["--global-batch", "16"])
    monkeypatch.setattr(outputs.os, "replace", real)
    assert code == 2 and "No space left" in err
    assert (case / "out.json").read_bytes() == before and sorted(p.name for p in case.glob(".out*")) == []
    shutil.copytree(case / "profiles", case / "target")
    assert invoke(["profile", "merge", "profiles", "other", "-o", "target"])[0] == 2
    code, _, err, _ = invoke(["profile", "merge", "profiles", "other", "-o", "target", "--force", "--prefer", "last"])
    assert code == 0, err


@pytest.mark.parametrize("argv, package, extra", [
    (PLAN_CMD + ["--plot", "front.png"], "matplotlib", "plot"),
    (SIMULATE + ["--plot", "timeline.png"], "matplotlib", "plot"),
    (["launch", "plan.json", "--local", "--", "--train-iters", "1"], "megatron.core", "runtime"),
    (["launch", "plan.json", "--local", "--", "--train-iters", "1"], "torch", "runtime"),
])
def test_a_missing_optional_package_names_its_extra(case, monkeypatch, argv, package, extra):
    """Before anything is written or started: which extra to install, in one line."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    if argv[0] == "launch":  # a free port: launch checks the default one (29500), which a parallel test may hold
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = [*argv[:argv.index("--")], "--master-port", str(port), *argv[argv.index("--"):]]
    before = _files(case)
    code, out, err, _ = invoke(argv)
    assert code == 2 and err.count("\n") == 1 and f"sailor[{extra}]" in err, err
    assert _files(case) == before


def test_a_tp_degree_the_heads_do_not_allow_names_the_heads(case):
    plan = _set(_set(_set(PLAN, ("model",), "gpt-neo-2.7b"), ("seq_length",), DELETE), ("global_batch_size",), 8)
    plan["stages"] = [{"layers": [0, 33], "replicas": [{"gpu": "H100-80", "tp": 8, "zone": "us-central1-a",
                                                         "count": 2}]}]
    _dump(case / "plan.json", plan)
    check_refused(["simulate", "plan.json"], case)
    assert "20 attention heads" in invoke(["simulate", "plan.json"])[2]


def test_a_mistaken_command_lists_every_command(case):
    from planner.cli import BUILTIN_COMMANDS, COMMAND_MODULES

    for argv in (["bogus"], ["plan", "--bogus"][:1] + ["--model", "tiny", "--bogus"]):
        code, _, err, _ = invoke(argv)
        assert code == 2 and err.count("\n") == 1
    err = invoke(["bogus"])[2]
    assert all(c in err for c in (*BUILTIN_COMMANDS, *COMMAND_MODULES)), err
