"""Profiles: what one model costs on one GPU type, layer by layer.

A `Profile` holds, for each (microbatch size, TP degree) that was measured,
the forward and backward time of every layer for one microbatch; the
optimizer-step time per parameter; and, per TP degree, the memory facts of
every layer (parameters on one GPU, activation bytes kept for backward per
sample, output bytes per sample). `source` says whether the numbers were
measured or estimated, and the CLI shows it.

A profile applies to every model with the same architecture as the one it
measured, whatever each is called (store.py): so our files carry the whole
model description (`model_config`, ModelSpec.to_dict()); files without it
describe the preset they are named after.

Our file format (one file per model and GPU type, `DIR/MODEL/GPU/profile.json`;
a "/" in the model's name, as in Hugging Face's, becomes "--" in MODEL):

    {"format": "sailor-profile", "version": 1, "model": "tiny", "gpu": "CPU",
     "model_config": {...}, "precision": "fp32", "created": "2026-11-22", "software": {"torch": "2.13.0"},
     "optimizer_s_per_param": 3.1e-9,
     "times": {"<mbs>": {"<tp>": {"fwd": [s, ...], "bwd": [s, ...]}}},      # per layer
     "memory": {"<tp>": {"params": [n, ...], "activation_bytes": [b, ...],   # per layer,
                         "output_bytes": [b, ...]}}}                         # per sample
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

from planner.errors import SailorError
from planner.inputs import MAX_BATCH, Doc, int_key, parse_json, read_text
from planner.specs.model import ModelSpec, canonical_name, get_model, is_preset, model_from_dict

MEASURED, ESTIMATED = "measured", "estimated"


@dataclass(frozen=True)
class LayerTimes:
    """Forward/backward seconds per layer for one microbatch, with prefix sums."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    _fwd_prefix: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _bwd_prefix: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_fwd_prefix", (0.0, *accumulate(self.fwd)))
        object.__setattr__(self, "_bwd_prefix", (0.0, *accumulate(self.bwd)))

    def stage(self, first: int, last: int) -> tuple[float, float]:
        """(forward, backward) seconds of layers first..last for one microbatch."""
        return (self._fwd_prefix[last + 1] - self._fwd_prefix[first],
                self._bwd_prefix[last + 1] - self._bwd_prefix[first])


@dataclass(frozen=True)
class LayerMemory:
    """Memory facts of every layer at one TP degree (bytes are per sample)."""

    params: tuple[int, ...]
    activation_bytes: tuple[float, ...]  # kept from forward for backward
    output_bytes: tuple[float, ...]
    # Peak extra bytes while the layer runs backward; None: as much as it keeps
    # (differs when a recomputed layer keeps only its input, simulator/recompute.py).
    workspace_bytes: tuple[float, ...] | None = None
    params_prefix: tuple[int, ...] = field(init=False, repr=False, compare=False)
    activation_prefix: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "params_prefix", (0, *accumulate(self.params)))
        object.__setattr__(self, "activation_prefix", (0.0, *accumulate(self.activation_bytes)))

    def stage_params(self, first: int, last: int) -> int:
        return self.params_prefix[last + 1] - self.params_prefix[first]

    def stage_activation_bytes(self, first: int, last: int) -> float:
        return self.activation_prefix[last + 1] - self.activation_prefix[first]

    def stage_workspace_bytes(self, first: int, last: int) -> float:
        """The largest backward workspace of layers first..last."""
        return max((self.workspace_bytes or self.activation_bytes)[first:last + 1])


@dataclass
class Profile:
    """Per-layer costs of one model on one GPU type."""

    model: str
    gpu: str
    num_layers: int
    precision: str  # fp32 | bf16 | fp16
    source: str  # measured | estimated
    times: dict[tuple[int, int], LayerTimes]  # (mbs, tp) -> times
    optimizer_s_per_param: float
    memory: dict[int, LayerMemory]  # tp -> memory facts
    meta: dict = field(default_factory=dict)
    model_spec: ModelSpec | None = None  # the model measured; None: the preset `model` names

    @property
    def runtime(self) -> str | None:
        """The framework whose layers these are (estimate.RUNTIME_WORK): Sailor's published profiles
        are Megatron-DeepSpeed's, files of `sailor profile` our runtime's; an estimate or a converted
        profile says which it is for. None: not said (taken as the runtime of the plans)."""
        return self.meta.get("runtime")

    def microbatch_sizes(self, tp: int | None = None) -> list[int]:
        return sorted({b for b, t in self.times if tp is None or t == tp})

    def tp_degrees(self) -> list[int]:
        return sorted({t for _, t in self.times})

    def layer_times(self, mbs: int, tp: int) -> LayerTimes:
        try:
            return self.times[(mbs, tp)]
        except KeyError:
            have = ", ".join(f"mbs {b}/tp {t}" for b, t in sorted(self.times)) or "nothing"
            raise SailorError(
                f"the {self.source} profile of {self.model} on {self.gpu} has no microbatch size {mbs} at TP {tp} "
                f"(it has {have}); profile it with `sailor profile model` or pick a profiled size"
            ) from None

    def layer_memory(self, tp: int) -> LayerMemory:
        try:
            return self.memory[tp]
        except KeyError:
            raise SailorError(f"the profile of {self.model} on {self.gpu} has no memory facts at TP {tp}; "
                              "re-profile with that TP degree") from None


# -- which models a profile applies to ----------------------------------------------
def measured_model(name: str, spec: ModelSpec | None) -> ModelSpec | None:
    """The model a profile measured: its description, else the preset it is named after (None: unknown)."""
    if spec is not None:
        return spec
    return get_model(name) if is_preset(name) else None


def model_key(name: str, spec: ModelSpec | None) -> tuple:
    """What a profile's numbers belong to: the measured model's architecture (its name only when the file
    describes no model sailor knows, as older profiles of config.json models)."""
    model = measured_model(name, spec)
    return ("architecture", model.architecture()) if model is not None else ("name", canonical_name(name))


def model_keys(model: ModelSpec) -> tuple[tuple, tuple]:
    """The keys of profiles that apply to `model`: its architecture, else its name."""
    return ("architecture", model.architecture()), ("name", canonical_name(model.name))


def smooth_over_microbatches(times: dict[tuple[int, int], LayerTimes]) -> dict[tuple[int, int], LayerTimes]:
    """Denoise measured times: each is one measurement of a roughly affine curve.

    A layer's time is close to affine in the microbatch size b over a factor
    of four (fixed launch cost + per-sample work: residuals under 3 % in most
    of Sailor's profiles). Each point with measured neighbours at b/2 and 2b
    is replaced by the least-squares line through the three, evaluated at b;
    the smallest and largest sizes stay as measured.
    """
    out = {}
    for (b, tp), lt in times.items():
        sizes = (b // 2, b, 2 * b)
        if b < 2 or any((x, tp) not in times for x in sizes):
            out[(b, tp)] = lt
            continue
        # least-squares line through (sizes, values), at b: mean + slope * (b - mean_b), with
        # slope = sum(w_k v_k), w_k = (x_k - mean_b) / sum((x - mean_b)^2)
        mean_b = sum(sizes) / 3
        w0, w1, w2 = ((x - mean_b) / sum((y - mean_b) ** 2 for y in sizes) for x in sizes)
        d = b - mean_b
        r0, r1, r2 = (times[(x, tp)] for x in sizes)
        out[(b, tp)] = LayerTimes(
            tuple((v0 + v1 + v2) / 3 + (w0 * v0 + w1 * v1 + w2 * v2) * d for v0, v1, v2 in zip(r0.fwd, r1.fwd, r2.fwd)),
            tuple((v0 + v1 + v2) / 3 + (w0 * v0 + w1 * v1 + w2 * v2) * d for v0, v1, v2 in zip(r0.bwd, r1.bwd, r2.bwd)))
    return out


def profile_to_dict(p: Profile) -> dict:
    times: dict = {}
    for (b, t), lt in sorted(p.times.items()):
        times.setdefault(str(b), {})[str(t)] = {"fwd": list(lt.fwd), "bwd": list(lt.bwd)}
    return {
        "format": "sailor-profile", "version": 1, "model": p.model, "gpu": p.gpu,
        **({"model_config": p.model_spec.to_dict()} if p.model_spec is not None else {}),
        "precision": p.precision, **p.meta,
        "optimizer_s_per_param": p.optimizer_s_per_param,
        "times": times,
        "memory": {str(t): {"params": list(m.params), "activation_bytes": list(m.activation_bytes),
                            "output_bytes": list(m.output_bytes)} for t, m in sorted(p.memory.items())},
    }


PROFILE_HINT = "see the profile format in docs/formats.md"
PROFILE_META = ("created", "software", "device", "notes", "origin")
RUNTIMES = ("sailor", "megatron-deepspeed")  # what ran the layers (estimate.RUNTIME_WORK)
MAX_SECONDS, MAX_BYTES, MAX_PARAMS = 1e6, 1e18, 1e15  # per layer: far beyond any real one


def profile_spec(d: dict, source_name: str) -> ModelSpec | None:
    """The model a profile file measured (its model_config), without reading the rest."""
    if not isinstance(d, dict) or d.get("model_config") is None:
        return None
    return model_from_dict(d["model_config"], f"profile {source_name}: model_config")


def tp_key(key: str, source: str, where) -> int:
    """A TP degree as a key of a profile. Sailor's data also measured TP 7 (OPT-30 on V100-16): such
    points are read, and the planner uses only powers of two."""
    return int_key(key, source, where, 1, 64)


def profile_from_dict(d: dict, source_name: str) -> Profile:
    source = f"profile {source_name}"
    top = Doc(d, source).fields(("model", "gpu", "times", "memory", "optimizer_s_per_param"),
                                ("format", "version", "model_config", "precision", "runtime", *PROFILE_META),
                                PROFILE_HINT)
    if "format" in top:
        top["format"].str(("sailor-profile",))
    if "version" in top:
        top["version"].int(1, 1, hint="this sailor reads version 1")
    spec = profile_spec(d, source_name)
    times, layers = {}, None
    for b, per_tp in top["times"].entries(PROFILE_HINT):
        mbs = int_key(b, source, "times", 1, MAX_BATCH)
        for t, v in per_tp.entries(PROFILE_HINT):
            tp = tp_key(t, source, f"times.{b}")
            f = v.fields(("fwd", "bwd"), hint=PROFILE_HINT)
            fwd = f["fwd"].numbers(layers, 0.0, MAX_SECONDS, "seconds per layer, one per layer")
            layers = len(fwd)
            bwd = f["bwd"].numbers(layers, 0.0, MAX_SECONDS, "seconds per layer, one per layer")
            if not fwd or sum(fwd) + sum(bwd) <= 0:
                v.fail("the times of at least one layer, not all zero", PROFILE_HINT)
            times[(mbs, tp)] = LayerTimes(fwd, bwd)
    if not times:
        top["times"].fail("at least one microbatch size and TP degree", PROFILE_HINT)
    memory = {}
    for t, v in top["memory"].entries(PROFILE_HINT):
        f = v.fields(("params", "activation_bytes", "output_bytes"), hint=PROFILE_HINT)
        memory[tp_key(t, source, "memory")] = LayerMemory(
            f["params"].ints(layers, 0, int(MAX_PARAMS), "one per layer"),
            f["activation_bytes"].numbers(layers, 0.0, MAX_BYTES, "one per layer"),
            f["output_bytes"].numbers(layers, 0.0, MAX_BYTES, "one per layer"))
    meta = {k: v.value for k, v in top.items() if k in PROFILE_META}
    # our profiler's files are sailor_ext's; a file exported from Sailor's data says its origin
    meta["runtime"] = top["runtime"].str(RUNTIMES) if "runtime" in top else (
        "megatron-deepspeed" if meta.get("origin") == "sailor-data" else "sailor")
    precision = top["precision"].str(("fp32", "bf16", "fp16")) if "precision" in top else "fp32"
    model, gpu = top["model"].str(), top["gpu"].str()
    dir_level(model, f"{source}: model", model=True)  # refused here, naming the file, before a merge writes it
    dir_level(gpu, f"{source}: gpu")
    return Profile(model, gpu, layers, precision, MEASURED, times,
                   top["optimizer_s_per_param"].number(0.0, 1.0), memory, meta, spec)


def profile_dir(directory: str | Path, model: str, gpu: str) -> Path:
    """DIR/MODEL/GPU: one level per part, also for Hugging Face names like org/model."""
    return Path(directory) / dir_level(model, "model", model=True) / dir_level(gpu, "gpu")


def dir_level(name: str, what: str, model: bool = False) -> str:
    """`name` as one directory level of a profiles directory (every writer's): a model's '/' becomes '--'; a
    '..' or '/' left would write outside the directory, over other files. `what` names where it came from."""
    level = name.replace("/", "--") if model else name
    if level in ("", ".", "..") or "/" in level or "\0" in level:
        if model:
            raise SailorError(f"{what} {name!r} must be a model name other than '.' or '..': it names a directory of "
                              "the profiles; give a name like opt-350m or org/model (a config.json's _name_or_path)")
        raise SailorError(f"{what} {name!r} must be a GPU type name (no '/' or '..'): it names a directory of the "
                          "profiles; give a name like A100-40")
    return level


def save_profile(p: Profile, directory: str) -> Path:
    path = profile_dir(directory, p.model, p.gpu) / "profile.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(profile_to_dict(p), indent=1) + "\n")
    tmp.replace(path)
    return path


def read_profile_file(path: Path) -> dict:
    d = parse_json(read_text(path, "profile"), f"profile {path}")
    if not isinstance(d, dict):
        raise SailorError(f"profile {path}: expected a JSON object; {PROFILE_HINT}")
    return d


def load_profile_file(path: Path) -> Profile:
    return profile_from_dict(read_profile_file(path), str(path))
