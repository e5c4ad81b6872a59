"""Measured network bandwidth curves.

Sailor's fits (providers/*.json) and ours (`sailor profile network`) give
bandwidth as a function of message size, for traffic between two nodes
(`inter`: zone, GPU type and the number of GPUs on each side that take part)
or inside one node (`intra`: GPU type and GPU count):

    BW(x) [GB/s] = c0*y^2 + c1*y + c2,   y = log2(x / 1e6),   capped at max_bytes_per_s

The quadratic was fitted on 64 KB..1 GB messages and goes wrong outside (it
can even turn negative), so y is clamped to that range: bigger messages get the
1 GB bandwidth, smaller ones the 64 KB bandwidth (latency-bound, conservative).
Our fits (planner.profiles.network_fit) record the range they were fitted on
(`min_bytes`, `max_bytes`), the link's measured latency (`latency_s`) and how
close a ring all-reduce over such links came to the ring model
(`allreduce_efficiency`); the simulator then clamps to that range, adds that
latency per message and uses that efficiency.

A link between two different GPU types that nobody measured runs at the pace
of its slower end: the bottleneck of the two same-type links (BottleneckFit).
Sailor's file has entries for mixed pairs, but they are copies of some other
entry (its README), not measurements, so they are not read.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import SailorError

Y_MIN, Y_MAX = math.log2(0.064), math.log2(1024.0)  # fitted range: 64 KB .. 1 GB


@dataclass(frozen=True)
class BandwidthFit:
    c0: float
    c1: float
    c2: float
    max_bytes_per_s: float
    latency_s: float | None = None  # measured per-message latency; None: the simulator's default for the link
    min_bytes: float | None = None  # fitted range; None: Sailor's 64 KB .. 1 GB
    max_bytes: float | None = None
    allreduce_efficiency: float | None = None  # measured ring all-reduce speed / this fit's; None: the default

    def bytes_per_s(self, nbytes: float) -> float:
        lo = Y_MIN if self.min_bytes is None else math.log2(self.min_bytes / 1e6)
        hi = Y_MAX if self.max_bytes is None else math.log2(self.max_bytes / 1e6)
        y = min(max(math.log2(max(nbytes, 1.0) / 1e6), lo), hi)
        gbps = self.c0 * y * y + self.c1 * y + self.c2
        return max(min(gbps * 1e9, self.max_bytes_per_s), 1e6)  # never below 1 MB/s


@dataclass(frozen=True)
class BottleneckFit:
    """The slower of two measured links at every message size (a link between two node
    types runs no faster than either type's NICs): for unmeasured mixed-type pairs."""
    a: BandwidthFit
    b: BandwidthFit

    def bytes_per_s(self, nbytes: float) -> float:
        return min(self.a.bytes_per_s(nbytes), self.b.bytes_per_s(nbytes))

    @property
    def latency_s(self) -> float | None:
        known = [f.latency_s for f in (self.a, self.b) if f.latency_s is not None]
        return max(known) if known else None

    @property
    def allreduce_efficiency(self) -> float | None:
        known = [f.allreduce_efficiency for f in (self.a, self.b) if f.allreduce_efficiency is not None]
        return min(known) if known else None


@dataclass
class NetworkFits:
    # (src_zone, src_gpu, src_gpus, dst_zone, dst_gpu, dst_gpus) -> fit
    inter: dict[tuple[str, str, int, str, str, int], BandwidthFit] = field(default_factory=dict)
    intra: dict[tuple[str, int], BandwidthFit] = field(default_factory=dict)  # (gpu, gpus) -> fit
    sources: list[str] = field(default_factory=list)

    def merge(self, other: "NetworkFits") -> None:
        self.inter.update(other.inter)
        self.intra.update(other.intra)
        self.sources += other.sources

    def inter_fit(self, src_zone, src_gpu, n_src, dst_zone, dst_gpu, n_dst) -> BandwidthFit | BottleneckFit | None:
        """The measured link; for two GPU types without one, the slower of the two types'
        own links between the same zones (None if either is unmeasured)."""
        fit = self.inter.get((src_zone, src_gpu, n_src, dst_zone, dst_gpu, n_dst))
        if fit is None and src_gpu != dst_gpu:
            a = self.inter.get((src_zone, src_gpu, n_src, dst_zone, src_gpu, n_dst))
            b = self.inter.get((src_zone, dst_gpu, n_src, dst_zone, dst_gpu, n_dst))
            if a is not None and b is not None:
                fit = BottleneckFit(a, b)
        return fit

    def intra_fit(self, gpu: str, n: int) -> BandwidthFit | None:
        return self.intra.get((gpu, n))


def _fit(entry, extra: dict | None = None) -> BandwidthFit:
    (c0, c1, c2), cap = entry
    extra = extra or {}

    def optional(key):
        return float(extra[key]) if extra.get(key) is not None else None

    return BandwidthFit(float(c0), float(c1), float(c2), float(cap), optional("latency_s"), optional("min_bytes"),
                        optional("max_bytes"), optional("allreduce_efficiency"))


def load_sailor_network(providers: Path, gpu_name) -> NetworkFits:
    """Read Sailor's providers/ folder; `gpu_name` maps its GPU names to ours."""
    fits = NetworkFits()
    inter_file = providers / "multizone_bandwidths_het.json"
    if inter_file.exists():
        data = json.loads(inter_file.read_text())
        for sz, by_gpu in data.items():
            for sg, by_n in by_gpu.items():
                for sn, by_dz in by_n.items():
                    for dz, by_dg in by_dz.items():
                        for dg, by_dn in by_dg.items():
                            if gpu_name(dg) != gpu_name(sg):
                                continue  # a copy of another entry, not a measurement (see above)
                            for dn, entry in by_dn.items():
                                key = (sz, gpu_name(sg), int(sn), dz, gpu_name(dg), int(dn))
                                fits.inter[key] = _fit(entry)
        fits.sources.append(str(inter_file))
    intra_file = providers / "intra_node_bandwidths.json"
    if intra_file.exists():
        for g, by_n in json.loads(intra_file.read_text()).items():
            for n, entry in by_n.items():
                fits.intra[(gpu_name(g), int(n))] = _fit(entry)
        fits.sources.append(str(intra_file))
    return fits


def load_network_file(path: Path) -> NetworkFits:
    """Read our network.json (written by `sailor profile network`)."""
    try:
        d = json.loads(path.read_text())
        fits = NetworkFits(sources=[str(path)])
        for e in d.get("inter", []):
            key = (e["src_zone"], e["src_gpu"], int(e["src_gpus"]), e["dst_zone"], e["dst_gpu"], int(e["dst_gpus"]))
            fits.inter[key] = _fit((e["coeffs"], e["max_bytes_per_s"]), e)
        for e in d.get("intra", []):
            fits.intra[(e["gpu"], int(e["gpus"]))] = _fit((e["coeffs"], e["max_bytes_per_s"]), e)
        return fits
    except json.JSONDecodeError as e:
        raise SailorError(f"network profile {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except (KeyError, TypeError, ValueError) as e:
        raise SailorError(f"network profile {path} is malformed ({e}); see docs/formats.md") from None
