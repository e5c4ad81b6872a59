"""Where the simulator gets its numbers: measured profiles, else estimates.

`load_profiles(dirs)` reads every directory given (`--profiles`, or the
SAILOR_PROFILES environment variable, colon-separated): a directory laid out
like Sailor's published data, or one of ours (MODEL/GPU/profile.json files and
an optional network.json). `ProfileStore.get(model, gpu)` returns the measured
profile if there is one, else an analytical estimate whose efficiency is
calibrated on the measured profiles at hand; the profile's `source` says which.
Both describe the store's runtime: the framework that will run the plans
(`sailor` for ours, `megatron-deepspeed` for Sailor's runs); a profile measured
by the other one, or in another precision, is converted (convert.py).

A measured profile applies to every model with the same architecture
(ModelSpec.architecture(): every field that changes a layer's time or
memory, the sequence length included), whatever each is called: a config.json describing Sailor's
LLAMA-3-8 at 8192 tokens uses its profiles; another sequence length, or
another width anywhere, gets an estimate.
"""
from __future__ import annotations

import os
from pathlib import Path

from planner.errors import SailorError
from planner.profiles.convert import converted_memory, converted_profile
from planner.profiles.estimate import (DEFAULT_RUNTIME, RUNTIME_WORK, Efficiency, calibrate_efficiency,
                                       estimate_profile, optimizer_s_per_param)
from planner.profiles.head_logits import lacks_logits, with_logit_memory, with_logits
from planner.profiles.network_fits import NetworkFits, load_network_file
from planner.profiles.profile import (Profile, measured_model, model_key, model_keys, profile_from_dict,
                                      profile_spec, read_profile_file, smooth_over_microbatches)
from planner.profiles.sailor_data import is_sailor_dir, load_sailor_dir
from planner.specs.hardware import CATALOG, GPUSpec
from planner.specs.model import ModelSpec, canonical_name, get_model


class ProfileStore:
    def __init__(self, measured: dict[tuple[str, str], Profile] | None = None,
                 network: NetworkFits | None = None, gpus: dict[str, GPUSpec] | None = None,
                 runtime: str = DEFAULT_RUNTIME, skipped: list[str] | None = None):
        """skipped: why profiles of the model's name were not used (notes for the user)."""
        if runtime not in RUNTIME_WORK:
            raise SailorError(f"unknown runtime {runtime!r}: use one of {', '.join(RUNTIME_WORK)}")
        self.runtime = runtime
        self.skipped = list(skipped or [])
        self.measured = dict(measured or {})
        self._by_model: dict[tuple, Profile] = {}  # (model_key, gpu) -> profile
        for p in self.measured.values():
            p.times = smooth_over_microbatches(p.times)
            self._by_model.setdefault((model_key(p.model, p.model_spec), p.gpu), p)
        self.network = network or NetworkFits()
        self._estimated: dict[tuple[ModelSpec, str, str], Profile] = {}
        self._completed: dict[int, Profile] = {}  # id(measured profile) -> it with its head's logits
        self._converted: dict[tuple[int, str], Profile] = {}  # (id, precision) -> it in this runtime, precision
        self._efficiency: Efficiency | None = None
        self._gpus = gpus or CATALOG

    def efficiency(self) -> Efficiency:
        """The estimator's efficiencies, fitted to the measured profiles at hand."""
        if self._efficiency is None:
            models = {p.model: m for p in self.measured.values()
                      if (m := measured_model(p.model, p.model_spec)) is not None}
            self._efficiency = calibrate_efficiency(self.measured.values(), models, self._gpus)
        return self._efficiency

    def get(self, model: ModelSpec, gpu: GPUSpec, precision: str = "fp32") -> Profile:
        """The measured profile of a model with `model`'s architecture on `gpu`, else an estimate; in
        `precision`, for the store's runtime (a profile measured otherwise is converted: convert.py)."""
        keys = model_keys(model)
        found = next((p for k in keys if (p := self._by_model.get((k, gpu.name))) is not None), None)
        if found is not None:
            if found.num_layers != model.num_layers:
                raise SailorError(f"the profile of {found.model} on {gpu.name} has {found.num_layers} layers but "
                                  f"{model.name} has {model.num_layers}; re-profile the model")
            if found.optimizer_s_per_param <= 0:  # not measured (Sailor's A100-80 files)
                found.optimizer_s_per_param = optimizer_s_per_param(gpu, self.efficiency(),
                                                                    found.runtime or self.runtime, found.precision)
                found.meta["optimizer"] = "estimated"
            if id(found) not in self._completed:  # a head measured without its logits gets them
                self._completed[id(found)] = with_logits(found, model, gpu)
            done = self._completed[id(found)]
            if done.precision == precision and done.runtime in (None, self.runtime):
                return done
            key = (id(found), precision)
            if key not in self._converted:  # measured in another precision or by another runtime
                self._converted[key] = converted_profile(done, model, gpu, precision, self.runtime)
            return self._converted[key]
        key = (model, gpu.name, precision)
        if key not in self._estimated:  # memory facts do not depend on the GPU: any measured ones apply
            memory = next((converted_memory(p.memory, model, p.precision, precision, p.runtime or self.runtime,
                                            self.runtime)
                           for (k, _), p in self._by_model.items() if k in keys), None)
            if memory is not None and lacks_logits(memory, model, precision):
                memory = with_logit_memory(memory, model, precision)
            self._estimated[key] = estimate_profile(model, gpu, precision, self.efficiency(), memory,
                                                    self.runtime)
        return self._estimated[key]


def profile_dirs(cli_dirs: list[str] | None) -> list[str]:
    if cli_dirs:
        return cli_dirs
    env = os.environ.get("SAILOR_PROFILES", "")
    return [d for d in env.split(os.pathsep) if d]


def load_profiles(dirs: list[str] | None = None, gpus: dict[str, GPUSpec] | None = None,
                  model: ModelSpec | str | None = None, runtime: str = DEFAULT_RUNTIME) -> ProfileStore:
    """Every profile in `dirs` (or only those that apply to `model`: a ModelSpec, or a preset's name),
    and the network fits, for plans that `runtime` runs. A file of another model is not parsed beyond
    its model description."""
    if isinstance(model, str):
        model = get_model(model)
    keys = model_keys(model) if model is not None else ()
    measured: dict[tuple[str, str], Profile] = {}
    skipped: list[str] = []
    network = NetworkFits()
    for d in profile_dirs(dirs):
        root = Path(d)
        if not root.is_dir():
            raise SailorError(f"profiles directory {d} not found; give a directory laid out like sailor-data "
                              "or written by `sailor profile`")
        if is_sailor_dir(root):
            profiles, fits = load_sailor_dir(root, model)
            measured.update(profiles)
            network.merge(fits)
            continue
        files = sorted(root.glob("*/*/profile.json"))
        for f in files:
            doc = read_profile_file(f)
            name = doc.get("model")
            # a profile of another model is not read beyond its description (a malformed one is read, and refused)
            if model is not None and isinstance(name, str) and name.strip():
                spec = profile_spec(doc, str(f))
                if model_key(name, spec) not in keys:
                    if canonical_name(name) == canonical_name(model.name):  # the model's name, other layers
                        skipped.append(_other_layers(f, name, spec, model))
                    continue
            p = profile_from_dict(doc, str(f))
            measured[(canonical_name(p.model), p.gpu)] = p
        net = root / "network.json"
        if net.exists():
            network.merge(load_network_file(net))
        if not files and not net.exists():
            raise SailorError(f"profiles directory {d} holds no profiles (expected MODEL/GPU/profile.json files, "
                              "or Sailor's layout with profiles/ and llm_info.json)")
    return ProfileStore(measured, network, gpus, runtime, skipped)


def _other_layers(path: Path, name: str, spec: ModelSpec | None, model: ModelSpec) -> str:
    """Why the profile at `path`, of a model named as `model`, does not apply to it: the fields that differ."""
    measured = measured_model(name, spec)
    theirs = measured.architecture().to_dict() if measured is not None else {}
    ours = model.architecture().to_dict()
    diff = ", ".join(f"{k} {theirs.get(k)!r}, here {ours[k]!r}" for k in ours if theirs.get(k) != ours[k])
    return (f"profile {path} measured {name} with other layers ({diff[:300]}), so it is not used; profile the model "
            "as planned here (sailor profile model) to use measurements")
