"""Profile directories as a whole: read everything in one, merge several into one.

Profiles are measured machine by machine (`sailor profile model` on each GPU
type, `sailor profile network` on each cluster), so a user ends up with one
directory per machine. `merge` combines them into one directory that
`--profiles` accepts: profiles of different (model, GPU) pairs are copied;
two profiles of the same pair (say TP 1-2 measured on one machine, TP 4 on
another) are combined point by point; network fits are combined link by link.
The same point measured twice with different numbers is a conflict: it is
refused unless `prefer` says which source wins ("first" or "last").
Sailor's published layout is accepted as a source and converted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import SailorError
from planner.inputs import parse_json, read_text
from planner.outputs import write_output
from planner.profiles.network_fits import BandwidthFit, NetworkFits, load_network_file
from planner.profiles.profile import Profile, load_profile_file, profile_dir, save_profile
from planner.profiles.sailor_data import is_sailor_dir, load_sailor_dir


@dataclass
class ProfileDir:
    """Everything one directory holds."""

    root: Path
    profiles: dict[tuple[str, str], Profile]  # (model, gpu) -> profile, as measured (no smoothing)
    network: dict | None  # our network.json as written, if any
    network_fits: NetworkFits = field(default_factory=NetworkFits)  # any layout's fits
    paths: dict[tuple[str, str], Path] = field(default_factory=dict)


def read_dir(path: str) -> ProfileDir:
    root = Path(path)
    if not root.is_dir():
        raise SailorError(f"profiles directory {path} not found")
    if is_sailor_dir(root):
        profiles, fits = load_sailor_dir(root)
        return ProfileDir(root, profiles, None, fits)
    profiles, paths = {}, {}
    for f in sorted(root.glob("*/*/profile.json")):
        p = load_profile_file(f)
        profiles[(p.model, p.gpu)] = p
        paths[(p.model, p.gpu)] = f
    network, fits = None, NetworkFits()
    net = root / "network.json"
    if net.exists():
        fits = load_network_file(net)
        network = parse_json(read_text(net, "network profile"), f"network profile {net}")
    if not profiles and network is None:
        partial = sorted(root.glob("*/*/profile.partial.json"))
        hint = f" (an unfinished run is in {partial[0].parent}: finish it with `sailor profile model --resume`)" \
            if partial else ""
        raise SailorError(f"profiles directory {path} holds no profiles (expected MODEL/GPU/profile.json or "
                          f"network.json){hint}")
    return ProfileDir(root, profiles, network, fits, paths)


# -- merging ---------------------------------------------------------------------------
def _pick(what: str, a, b, sources: tuple[str, str], prefer: str | None):
    if a == b:
        return a
    if prefer == "first":
        return a
    if prefer == "last":
        return b
    raise SailorError(f"{what} differs between {sources[0]} and {sources[1]}; pass --prefer first or "
                      "--prefer last to choose")


def merge_profiles(a: Profile, b: Profile, sources: tuple[str, str], prefer: str | None) -> Profile:
    """One profile of the same model and GPU type from two measurements."""
    name = f"the profile of {a.model} on {a.gpu}"
    if a.num_layers != b.num_layers:
        raise SailorError(f"{name} has {a.num_layers} layers in {sources[0]} but {b.num_layers} in {sources[1]}; "
                          "re-profile one of them")
    if a.model_spec is not None and b.model_spec is not None and \
            a.model_spec.architecture() != b.model_spec.architecture():
        raise SailorError(f"{name} describes different models in {sources[0]} and {sources[1]} (another architecture "
                          "or sequence length); they cannot be merged")
    if a.precision != b.precision:
        raise SailorError(f"{name} is {a.precision} in {sources[0]} but {b.precision} in {sources[1]}; they "
                          "describe different training and cannot be merged")
    times = dict(a.times)
    for key, lt in b.times.items():
        times[key] = _pick(f"{name} at microbatch {key[0]}, TP {key[1]}", times[key], lt, sources, prefer) \
            if key in times else lt
    memory = dict(a.memory)
    for tp, mem in b.memory.items():
        memory[tp] = _pick(f"{name}'s memory at TP {tp}", memory[tp], mem, sources, prefer) if tp in memory else mem
    optimizer = a.optimizer_s_per_param if a.optimizer_s_per_param > 0 else b.optimizer_s_per_param
    if a.optimizer_s_per_param > 0 and b.optimizer_s_per_param > 0 and prefer == "last":
        optimizer = b.optimizer_s_per_param
    notes = dict(a.meta.get("notes") or {})
    notes["merged_from"] = [*notes.get("merged_from", [sources[0]]), sources[1]]
    return Profile(a.model, a.gpu, a.num_layers, a.precision, a.source, times, optimizer, memory,
                   {**a.meta, "notes": notes}, a.model_spec or b.model_spec)


def _fit_entry(fit: BandwidthFit) -> dict:
    entry = {"coeffs": [fit.c0, fit.c1, fit.c2], "max_bytes_per_s": fit.max_bytes_per_s}
    for key in ("latency_s", "min_bytes", "max_bytes"):
        if getattr(fit, key) is not None:
            entry[key] = getattr(fit, key)
    return entry


def network_entries(d: ProfileDir) -> tuple[dict, dict, list]:
    """(intra by key, inter by key, all-reduce measurements) of a directory, as network.json entries."""
    if d.network is not None:
        intra = {(e["gpu"], int(e["gpus"])): e for e in d.network.get("intra", [])}
        inter = {(e["src_zone"], e["src_gpu"], int(e["src_gpus"]), e["dst_zone"], e["dst_gpu"], int(e["dst_gpus"])): e
                 for e in d.network.get("inter", [])}
        return intra, inter, list(d.network.get("allreduce", []))
    intra = {k: {"gpu": k[0], "gpus": k[1], **_fit_entry(f)} for k, f in d.network_fits.intra.items()}
    inter = {k: {"src_zone": k[0], "src_gpu": k[1], "src_gpus": k[2], "dst_zone": k[3], "dst_gpu": k[4],
                 "dst_gpus": k[5], **_fit_entry(f)} for k, f in d.network_fits.inter.items()}
    return intra, inter, []


@dataclass(frozen=True)
class MergeResult:
    profiles: list[Path]
    network: Path | None
    combined: list[tuple[str, str]]  # (model, gpu) pairs measured in more than one source


def merge_dirs(sources: list[str], out: str, prefer: str | None = None, force: bool = False) -> MergeResult:
    """Merge `sources` into `out`; files already in `out` are replaced only with `force`."""
    if len(sources) < 2:
        raise SailorError("give at least two profile directories to merge")
    out_root = Path(out).resolve()
    if any(Path(s).resolve() == out_root or out_root in Path(s).resolve().parents or
           Path(s).resolve() in out_root.parents for s in sources):
        raise SailorError(f"the output {out} overlaps a source directory; write the merge to a directory of its own")
    if out_root.exists() and not out_root.is_dir():
        raise SailorError(f"the output {out} is a file; give a directory")
    dirs = [read_dir(s) for s in sources]
    merged: dict[tuple[str, str], Profile] = {}
    origin: dict[tuple[str, str], str] = {}
    combined = []
    for d in dirs:
        for key, p in d.profiles.items():
            if key in merged:
                merged[key] = merge_profiles(merged[key], p, (origin[key], str(d.root)), prefer)
                combined.append(key)
            else:
                merged[key] = p
            origin[key] = str(d.root)
    intra, inter, allreduce = {}, {}, []
    net_origin: dict = {}
    for d in dirs:
        di, dx, dar = network_entries(d)
        for table, entries, kind in ((intra, di, "intra-node"), (inter, dx, "inter-node")):
            for key, e in entries.items():
                if key in table:
                    table[key] = _pick(f"the {kind} fit {key}", table[key], e, (net_origin[key], str(d.root)),
                                       prefer)
                else:
                    table[key] = e
                net_origin[key] = str(d.root)
        allreduce += dar
    if not merged and not intra and not inter:
        raise SailorError("the sources hold no profiles and no network fits; nothing to merge")
    targets = [profile_dir(out, *key) / "profile.json" for key in sorted(merged)]
    targets += [out_root / "network.json"] if intra or inter else []
    occupied = [t for t in targets if t.exists()]
    if occupied and not force:
        raise SailorError(f"{occupied[0]} already exists ({len(occupied)} file(s) of the merge would be replaced); "
                          "merge into an empty directory, or add --force to replace them")
    paths = [save_profile(p, out) for _, p in sorted(merged.items())]
    network = None
    if intra or inter:
        doc = {"format": "sailor-network", "version": 1, "merged_from": [str(d.root) for d in dirs],
               "intra": list(intra.values()), "inter": list(inter.values()), "allreduce": allreduce}
        out_root.mkdir(parents=True, exist_ok=True)
        network = write_output(out_root / "network.json", json.dumps(doc, indent=1) + "\n", what="network profile")
    return MergeResult(paths, network, sorted(set(combined)))
