"""Where the simulator gets its numbers: measured profiles, else estimates.

`load_profiles(dirs)` reads every directory given (`--profiles`, or the
SAILOR_PROFILES environment variable, colon-separated): a directory laid out
like Sailor's published data, or one of ours (MODEL/GPU/profile.json files and
an optional network.json). `ProfileStore.get(model, gpu)` returns the measured
profile if there is one, else an analytical estimate whose efficiency is
calibrated on the measured profiles at hand; the profile's `source` says which.
"""
from __future__ import annotations

import os
from pathlib import Path

from planner.errors import SailorError
from planner.profiles.estimate import calibrate_efficiency, estimate_profile, optimizer_s_per_param
from planner.profiles.network_fits import NetworkFits, load_network_file
from planner.profiles.profile import Profile, load_profile_file, smooth_over_microbatches
from planner.profiles.sailor_data import is_sailor_dir, load_sailor_dir
from planner.specs.hardware import CATALOG, GPUSpec
from planner.specs.model import ModelSpec, canonical_name, get_model


class ProfileStore:
    def __init__(self, measured: dict[tuple[str, str], Profile] | None = None,
                 network: NetworkFits | None = None, gpus: dict[str, GPUSpec] | None = None):
        self.measured = dict(measured or {})
        for p in self.measured.values():
            p.times = smooth_over_microbatches(p.times)
        self.network = network or NetworkFits()
        self._estimated: dict[tuple[str, str, str], Profile] = {}
        self._efficiency: float | None = None
        self._gpus = gpus or CATALOG

    def efficiency(self) -> float:
        """Median measured model-FLOPs utilisation, used for estimates."""
        if self._efficiency is None:
            models = {}
            for p in self.measured.values():
                try:
                    models[p.model] = get_model(p.model)
                except SailorError:
                    pass
            self._efficiency = calibrate_efficiency(self.measured.values(), models, self._gpus)
        return self._efficiency

    def get(self, model: ModelSpec, gpu: GPUSpec, precision: str = "fp32") -> Profile:
        name = canonical_name(model.name)
        found = self.measured.get((name, gpu.name))
        if found is not None:
            if found.num_layers != model.num_layers:
                raise SailorError(f"the profile of {name} on {gpu.name} has {found.num_layers} layers but the model "
                                  f"has {model.num_layers}; re-profile the model")
            if found.optimizer_s_per_param <= 0:  # not measured (Sailor's A100-80 files)
                found.optimizer_s_per_param = optimizer_s_per_param(gpu, self.efficiency())
                found.meta["optimizer"] = "estimated"
            return found
        key = (name, gpu.name, precision)
        if key not in self._estimated:
            memory = next((p.memory for (m, _), p in self.measured.items() if m == name), None)
            self._estimated[key] = estimate_profile(model, gpu, precision, self.efficiency(), memory)
        return self._estimated[key]


def profile_dirs(cli_dirs: list[str] | None) -> list[str]:
    if cli_dirs:
        return cli_dirs
    env = os.environ.get("SAILOR_PROFILES", "")
    return [d for d in env.split(os.pathsep) if d]


def load_profiles(dirs: list[str] | None = None, gpus: dict[str, GPUSpec] | None = None,
                  model: str | None = None) -> ProfileStore:
    """Every profile in `dirs` (or only those of `model`), and the network fits."""
    measured: dict[tuple[str, str], Profile] = {}
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
        files = sorted(root.glob(f"{canonical_name(model) if model else '*'}/*/profile.json"))
        for f in files:
            p = load_profile_file(f)
            measured[(canonical_name(p.model), p.gpu)] = p
        net = root / "network.json"
        if net.exists():
            network.merge(load_network_file(net))
        if not files and not net.exists():
            raise SailorError(f"profiles directory {d} holds no profiles (expected MODEL/GPU/profile.json files, "
                              "or Sailor's layout with profiles/ and llm_info.json)")
    return ProfileStore(measured, network, gpus)
