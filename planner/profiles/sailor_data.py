"""Read (and write) the data published with the Sailor paper, in its own layout.

    ROOT/profiles/profiles_tmp.json          {model: {gpu: {mbs: {tp: {layer: [fwd, bwd, update]}}}}}
    ROOT/profiles/MODEL/GPU/profile.json     {mbs: {tp: {layer: [fwd, bwd, update]}}}
    ROOT/llm_info.json                       {model: {tp: {layer: {params_floats, act_mem_floats, ...}}}}
    ROOT/providers/...                       network fits (see network_fits.py)

Quirks handled here (from the data's README):
  * profiles_tmp.json wins where it disagrees with a per-file profile
    (GPT-Neo-2.7 on GH-96 is a copy of OPT-350's in the per-file set);
  * `update` is the optimizer step of the whole two-block profiling model
    (embedding, two blocks, head), written into every layer. We turn it into
    seconds per parameter: update / params(profiling model at that TP);
  * all runs were fp32, so activation and output bytes are 4 * floats;
  * llm_info lacks some TP degrees for which times exist (GPT-Neo TP 8): those
    are derived per layer from the measured ones with the Megatron structure
    x(t) = replicated + sharded/t, fitted by least squares.

`save_sailor_dir` writes our profiles in this layout (profiles/MODEL/GPU/profile.json
and llm_info.json), so Sailor's own planner can use what `sailor profile model`
measured. It inverts the reading above: `update` = seconds per parameter x the
parameters of the two-block profiling model, floats = bytes / 4.
"""
from __future__ import annotations

import json
import math
from itertools import chain
from operator import itemgetter
from pathlib import Path

from planner.errors import SailorError
from planner.inputs import MAX_BATCH, Doc, int_key, parse_json, read_text
from planner.outputs import write_output
from planner.profiles.network_fits import NetworkFits, load_sailor_network
from planner.profiles.profile import (MAX_BYTES, MAX_PARAMS, MAX_SECONDS, MEASURED, LayerMemory, LayerTimes, Profile,
                                      dir_level, measured_model, model_keys, tp_key)
from planner.specs.hardware import SAILOR_GPU_NAMES, canonical_gpu
from planner.specs.model import SAILOR_NAMES, ModelSpec, canonical_name, get_model, is_preset

FP32_BYTES = 4


def is_sailor_dir(root: Path) -> bool:
    return (root / "profiles").is_dir() and (root / "llm_info.json").exists()


def _gpu_name(name: str) -> str:
    return canonical_gpu(name) or name


def _read(path: Path, what: str) -> Doc:
    where = f"{what} {path}"
    return Doc(parse_json(read_text(path, what), where), where)


def load_sailor_dir(root: Path, model: ModelSpec | str | None = None) -> tuple[dict, NetworkFits]:
    """Profiles keyed by (our model name, our GPU name), and the network fits.

    The layout names its models only, so only the presets' are read (an
    exported profile of a config.json model is for Sailor's own planner).
    With `model` (a ModelSpec or a preset's name), only the profiles of
    models with its architecture are read (a planner run needs no others).
    Every value read is checked: a malformed file is one line naming it.
    """
    info = dict(_read(root / "llm_info.json", "Sailor's llm_info").entries(SAILOR_HINT))
    if isinstance(model, str):
        model = get_model(model)
    keys = model_keys(model) if model is not None else ()

    def wanted(name: str) -> bool:
        return is_preset(name) and (model is None or ("architecture", get_model(name).architecture()) in keys)

    raw: dict[tuple[str, str], dict] = {}  # every file is checked, also one the merged file overrides
    for f in sorted((root / "profiles").glob("*/*/profile.json")):
        if wanted(f.parent.parent.name):
            raw[(f.parent.parent.name, f.parent.name)] = _points(_read(f, "Sailor profile"),
                                                                 get_model(f.parent.parent.name).num_layers)
    merged = root / "profiles" / "profiles_tmp.json"
    if merged.exists():
        for name, by_gpu in _read(merged, "Sailor profiles").entries(SAILOR_HINT):
            if wanted(name):
                for gpu, data in by_gpu.entries(SAILOR_HINT):
                    raw[(name, gpu)] = _points(data, get_model(name).num_layers)  # the merged file wins
    profiles, memories = {}, {}
    for (model_name, gpu_name), points in raw.items():
        if model_name not in info:
            continue
        spec = get_model(model_name)  # a preset (wanted)
        if model_name not in memories:  # the same for every GPU type
            memories[model_name] = memory_facts(info[model_name], spec.num_layers)
        memory = memories[model_name]
        profile = _profile(spec, _gpu_name(gpu_name), points, memory)
        if profile is not None:
            profiles[(profile.model, profile.gpu)] = profile
    network = load_sailor_network(root / "providers", _gpu_name) if (root / "providers").is_dir() else NetworkFits()
    return profiles, network


SAILOR_HINT = "see Sailor's data layout in docs/formats.md"
FLOAT_FIELDS = ("params_floats", "act_mem_floats", "act_output_floats")


def memory_facts(by_tp: Doc, num_layers: int) -> dict[int, LayerMemory]:
    """llm_info for one model -> per-TP LayerMemory, filling TP 8 if missing."""
    out: dict[int, LayerMemory] = {}
    for tp, layers in by_tp.entries(SAILOR_HINT):
        tp = tp_key(tp, by_tp.source, by_tp)
        rows = dict(layers.entries(SAILOR_HINT))
        if len(rows) != num_layers:
            continue
        facts = []
        for i in range(num_layers):
            if str(i) not in rows:
                raise SailorError(f"{layers.source}: {layers.path} has no layer {i} of {num_layers}; {SAILOR_HINT}")
            row = rows[str(i)].value
            p, a, o = (row.get(k) for k in FLOAT_FIELDS) if isinstance(row, dict) else (None, None, None)
            if type(p) is int and type(a) in NUMBER and type(o) in NUMBER and 0 <= p <= MAX_PARAMS and \
                    0 <= a <= MAX_BYTES and 0 <= o <= MAX_BYTES:
                facts.append((p, float(a), float(o)))  # the common case; else the slow way names the mistake
                continue
            f = rows[str(i)].fields(FLOAT_FIELDS, open_ended=True, hint=SAILOR_HINT)
            facts.append((f["params_floats"].int(0, int(MAX_PARAMS)), f["act_mem_floats"].number(0, MAX_BYTES),
                          f["act_output_floats"].number(0, MAX_BYTES)))
        out[tp] = LayerMemory(tuple(p for p, _, _ in facts), tuple(FP32_BYTES * a for _, a, _ in facts),
                              tuple(FP32_BYTES * o for _, _, o in facts))
    measured = sorted(out)
    if len(measured) >= 2:
        for tp in (1, 2, 4, 8):
            if tp not in out:
                out[tp] = LayerMemory(
                    tuple(round(_replicated_plus_sharded([(t, out[t].params[i]) for t in measured], tp))
                          for i in range(num_layers)),
                    tuple(_replicated_plus_sharded([(t, out[t].activation_bytes[i]) for t in measured], tp)
                          for i in range(num_layers)),
                    out[measured[0]].output_bytes,
                )
    return out


def _replicated_plus_sharded(points: list[tuple[int, float]], tp: int) -> float:
    """Least-squares fit of x(t) = a + b/t through measured (t, x); value at tp."""
    us = [1.0 / t for t, _ in points]
    xs = [x for _, x in points]
    mu, mx = math.fsum(us) / len(us), math.fsum(xs) / len(xs)
    var = sum((u - mu) ** 2 for u in us)
    b = sum((u - mu) * (x - mx) for u, x in zip(us, xs)) / var if var else 0.0
    return max(mx - b * mu + b / tp, 0.0)


def _points(data: Doc, n: int) -> dict[tuple[int, int], list[tuple[float, ...]]]:
    """{(mbs, tp): [(fwd, bwd, update) per layer]} of one profile, every value checked; points with
    another layer count are left out (the GPT-Neo/GH-96 copy of OPT-350's file, partial runs)."""
    out, keys = {}, [str(i) for i in range(n)]
    key_set = set(keys)
    for mbs, by_tp in data.entries(SAILOR_HINT):
        mbs = int_key(mbs, data.source, data, 1, MAX_BATCH)
        for tp, layers in by_tp.entries(SAILOR_HINT):
            tp = tp_key(tp, by_tp.source, by_tp)
            rows = _fast_rows(layers.value)
            if rows is None:  # something is off: the slow way finds and names it
                rows = {key: entry.numbers(3, 0.0, MAX_SECONDS, "write [forward s, backward s, update s]")
                        for key, entry in layers.entries(SAILOR_HINT)}
            if rows.keys() != key_set:
                continue
            ordered = [rows[k] for k in keys]
            if sum(map(itemgetter(0), ordered)) + sum(map(itemgetter(1), ordered)) <= 0:
                layers.fail("the times of at least one layer, not all zero", SAILOR_HINT)
            out[(mbs, tp)] = ordered
    return out


NUMBER = (int, float)
NUMBER_TYPES = {int, float}


def _fast_rows(value) -> dict | None:
    """{layer: (fwd, bwd, update)} when every row is three numbers in range; None otherwise. Sailor's
    files hold thousands of rows: this is the check they take, in C loops (map, set, min, max). The
    JSON reader has refused NaN; an infinity is out of range."""
    if not isinstance(value, dict) or not value:
        return None
    rows = value.values()
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {3}:
        return None
    flat = list(chain.from_iterable(rows))
    types = set(map(type, flat))
    if not types <= NUMBER_TYPES or not (0 <= min(flat) and max(flat) <= MAX_SECONDS):
        return None
    if types == {float}:
        return dict(zip(value, map(tuple, rows)))
    return {key: (float(row[0]), float(row[1]), float(row[2])) for key, row in value.items()}


def _profile(model, gpu: str, points: dict, memory: dict[int, LayerMemory]) -> Profile | None:
    times, per_param = {}, []
    for (mbs, tp), rows in points.items():
        times[(mbs, tp)] = LayerTimes(tuple(r[0] for r in rows), tuple(r[1] for r in rows))
        update = rows[1][2]
        mem = memory.get(tp)
        if update > 0 and mem is not None:
            profiled = mem.params[0] + 2 * mem.params[1] + mem.params[-1]  # embedding, 2 blocks, head
            if profiled > 0:
                per_param.append(update / profiled)
    if not times:
        return None
    return Profile(
        model=canonical_name(model.name), gpu=gpu, num_layers=model.num_layers, precision="fp32", source=MEASURED,
        times=times, optimizer_s_per_param=_median(per_param) if per_param else 0.0,
        memory=memory, meta={"origin": "sailor-data", "runtime": "megatron-deepspeed"}, model_spec=model,
    )


def _median(xs: list[float]) -> float:
    """statistics.median, without importing statistics (which brings fractions and decimal: 2 % of the
    instructions of a whole `sailor plan` on 512 GPUs)."""
    xs, half = sorted(xs), len(xs) // 2
    return xs[half] if len(xs) % 2 else (xs[half - 1] + xs[half]) / 2


def save_sailor_dir(profiles: list[Profile], root: Path) -> list[Path]:
    """Write profiles in Sailor's layout under root; llm_info.json keeps the models it already has."""
    info_path = root / "llm_info.json"
    info = {}
    for name, by_tp in _read(info_path, "Sailor's llm_info").entries(SAILOR_HINT) if info_path.exists() else ():
        by_tp.entries(SAILOR_HINT)  # an object per model, kept as it is
        info[name] = by_tp.value
    written = []
    for p in profiles:
        model = measured_model(p.model, p.model_spec) or get_model(p.model)
        name = dir_level(SAILOR_NAMES.get(canonical_name(p.model), p.model), "model", model=True)
        data: dict = {}
        for (mbs, tp), lt in sorted(p.times.items()):
            mem = p.memory.get(tp)
            update = p.optimizer_s_per_param * (mem.params[0] + 2 * mem.params[1] + mem.params[-1]) if mem else 0.0
            data.setdefault(str(mbs), {})[str(tp)] = {str(i): [f, b, update] for i, (f, b) in
                                                      enumerate(zip(lt.fwd, lt.bwd))}
        path = root / "profiles" / name / dir_level(SAILOR_GPU_NAMES.get(p.gpu, p.gpu), "gpu") / "profile.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_output(path, json.dumps(data, indent=1) + "\n", what="Sailor profile")
        written.append(path)
        by_tp = info.setdefault(name, {})
        for tp, mem in sorted(p.memory.items()):
            layers = {}
            for i in range(p.num_layers):
                out = mem.output_bytes[i] / FP32_BYTES
                inp = mem.output_bytes[i - 1] / FP32_BYTES if i else float(model.seq_len)  # token ids
                act = mem.activation_bytes[i] / FP32_BYTES
                layers[str(i)] = {"params_floats": mem.params[i], "act_output_floats": out, "act_input_floats": inp,
                                  "act_mem_floats": act, "params_bytes": FP32_BYTES * mem.params[i],
                                  "act_output_bytes": FP32_BYTES * out, "act_input_bytes": FP32_BYTES * inp,
                                  "act_mem_bytes": FP32_BYTES * act}
            by_tp[str(tp)] = layers
    root.mkdir(parents=True, exist_ok=True)
    write_output(info_path, json.dumps(info, indent=1) + "\n", what="Sailor's llm_info")
    return written
