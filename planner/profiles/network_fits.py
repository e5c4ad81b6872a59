"""Measured network bandwidth curves.

Sailor's fits (providers/*.json) and ours (`sailor profile network`) give
bandwidth as a function of message size, for traffic between two nodes
(`inter`: zone, GPU type and the number of GPUs on each side that take part)
or inside one node (`intra`: GPU type and GPU count):

    BW(x) [GB/s] = c0*y^2 + c1*y + c2,   y = log2(x / 1e6),   capped at max_bytes_per_s

The quadratic was fitted on 64 KB..1 GB messages and goes wrong outside (it
can even turn negative), so y is clamped to that range: bigger messages get the
1 GB bandwidth, smaller ones the 64 KB bandwidth (latency-bound, conservative).
Inside the range a quadratic can still say what no link does (a larger message
streaming slower, or a smaller one taking longer); BandwidthFit.bytes_per_s
reads it by the rules every link obeys (the simulator and the planner's bounds
rely on them).
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

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path

from planner.inputs import Doc, int_key, is_int_key, parse_json, read_text

Y_MIN, Y_MAX = math.log2(0.064), math.log2(1024.0)  # fitted range: 64 KB .. 1 GB


@dataclass(frozen=True)
class BandwidthFit:
    """Bytes/s of one link as a function of the message size (Sailor's quadratic fit, capped)."""

    c0: float
    c1: float
    c2: float
    max_bytes_per_s: float
    latency_s: float | None = None  # measured per-message latency; None: the simulator's default for the link
    min_bytes: float | None = None  # fitted range; None: Sailor's 64 KB .. 1 GB
    max_bytes: float | None = None
    allreduce_efficiency: float | None = None  # measured ring all-reduce speed / this fit's; None: the default

    @cached_property
    def _range(self) -> tuple[float, float]:
        """The fitted range of y = log2(bytes / 1e6)."""
        return (Y_MIN if self.min_bytes is None else math.log2(self.min_bytes / 1e6),
                Y_MAX if self.max_bytes is None else math.log2(self.max_bytes / 1e6))

    def _fit_rate(self, y: float) -> float:
        """The fit's bytes/s at y = log2(bytes / 1e6) inside the fitted range, clamped to the cap and
        to at least 1 MB/s."""
        return max(min((self.c0 * y * y + self.c1 * y + self.c2) * 1e9, self.max_bytes_per_s), 1e6)

    @cached_property
    def _below(self) -> tuple[float, float, float]:
        """(rate at lo, y of the quadratic's vertex (inf where it has no maximum above lo), rate there)."""
        lo, c0, c1 = self._range[0], self.c0, self.c1
        top = -c1 / (2 * c0) if c0 < 0 and -c1 / (2 * c0) > lo else math.inf
        return self._fit_rate(lo), top, self._fit_rate(top) if top < math.inf else 0.0

    def _rate(self, y: float) -> float:
        """Bytes/s at y (inside the fitted range) by the chunking rule: a message streams at least as
        fast as any smaller one, since it could go as back-to-back pieces of that size. So the most
        the fit gives from lo up to y: at lo, at y, or at the quadratic's vertex in between."""
        at_lo, top, at_top = self._below
        return max(at_lo, self._fit_rate(y), at_top if top < y else 0.0)

    @cached_property
    def _faster_later(self) -> tuple[list[float], list[float]]:
        """(ys, least): where, inside the fitted range, a larger message would take less time than
        a smaller one. The time t(y) = 1e6 * 2^y / rate(y) [s] is least on [y, hi] at y, at hi, or at a
        point in between where t stops falling. It falls only where rate follows the quadratic q (in
        GB/s) and q'/q > ln 2, and stops where d ln t / dy = ln 2 - q'/q = 0:
            ln2 c0 y^2 + (ln2 c1 - 2 c0) y + ln2 c2 - c1 = 0,
        or where q reaches the cap (on `_rate`'s flat pieces t only grows). Those are ys; least[i] is
        the least t over ys[i:]. Beyond hi t only grows too (the rate stays at its value at hi)."""
        lo, hi = self._range
        ln2, (c0, c1, c2) = math.log(2), (self.c0, self.c1, self.c2)
        ys = {hi}
        for a, b, c in ((ln2 * c0, ln2 * c1 - 2 * c0, ln2 * c2 - c1), (c0, c1, c2 - self.max_bytes_per_s / 1e9)):
            ys.update(y for y in _roots(a, b, c) if lo < y < hi)
        ys = sorted(ys)
        times = [1e6 * 2 ** y / self._rate(y) for y in ys]
        least = list(times)
        for i in range(len(least) - 2, -1, -1):
            least[i] = min(least[i], least[i + 1])
        return ys, least

    def bytes_per_s(self, nbytes: float) -> float:
        """Bytes/s for a message of `nbytes`: the fit (a quadratic in log size, clamped), read by two
        rules every link obeys and the quadratic need not: a message streams at least as fast as a
        smaller one (`_rate`: send it in pieces), and takes at most as long as a larger one (send it
        as part of the larger):
            t(x) = min over x' >= x of x' / rate(x'),   bytes_per_s = x / t(x).
        Of Sailor's 524 fits, 207 fall after a peak (by up to 20 % within 64 KB..1 GB) and 188 move
        some message below 0.6 MB in more time than a larger one (the quadratic dives to the 1 MB/s
        floor)."""
        (lo, hi), (ys, least) = self._range, self._faster_later
        x = max(nbytes, 1.0)
        y = math.log2(x / 1e6)
        rate = self._rate(min(max(y, lo), hi))
        if y < hi:
            i = bisect_right(ys, y)
            if least[i] * rate < x:
                return x / least[i]
        return rate

    @property
    def peak_bytes_per_s(self) -> float:
        """No message size gets more (bytes_per_s is capped, and its rules only borrow rates the fit
        gives at other sizes)."""
        return max(self.max_bytes_per_s, 1e6)


def _roots(a: float, b: float, c: float) -> list[float]:
    """Real roots of a y^2 + b y + c = 0 (of b y + c where a = 0)."""
    if a == 0:
        return [-c / b] if b else []
    disc = b * b - 4 * a * c
    if disc < 0:
        return []
    r = math.sqrt(disc)
    return [(-b - r) / (2 * a), (-b + r) / (2 * a)]


@dataclass(frozen=True)
class BottleneckFit:
    """The slower of two measured links at every message size (a link between two node
    types runs no faster than either type's NICs): for unmeasured mixed-type pairs."""
    a: BandwidthFit
    b: BandwidthFit

    def bytes_per_s(self, nbytes: float) -> float:
        return min(self.a.bytes_per_s(nbytes), self.b.bytes_per_s(nbytes))

    @property
    def peak_bytes_per_s(self) -> float:
        return min(self.a.peak_bytes_per_s, self.b.peak_bytes_per_s)

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
    """Every measured link's fit: between zones (per GPU type and count) and inside a node."""

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


NETWORK_HINT = "see the network profile format in docs/formats.md"
MAX_COEFF, MAX_RATE = 1e9, 1e15  # GB/s polynomial coefficients; bytes per second


def _fit(coeffs: Doc, cap: Doc, extra: dict[str, Doc] | None = None) -> BandwidthFit:
    """A fit from its coefficients, cap and (ours) optional measured facts, every value checked."""
    c0, c1, c2 = coeffs.numbers(3, -MAX_COEFF, MAX_COEFF, "write [c0, c1, c2]")
    extra = extra or {}

    def optional(key, lo=0.0, above=None, hi=MAX_RATE):
        doc = extra.get(key)
        return None if doc is None or doc.value is None else doc.number(lo if above is None else None, hi, above)

    fit = BandwidthFit(c0, c1, c2, cap.number(above=0.0, hi=MAX_RATE), optional("latency_s", hi=1e3),
                       optional("min_bytes", above=0.0), optional("max_bytes", above=0.0),
                       optional("allreduce_efficiency", above=0.0, hi=1e3))
    if fit.min_bytes is not None and fit.max_bytes is not None and fit.min_bytes > fit.max_bytes:
        cap.fail(f"a fit whose min_bytes ({fit.min_bytes:g}) is at most its max_bytes ({fit.max_bytes:g})")
    return fit


def _sailor_entry(doc: Doc) -> BandwidthFit:
    v = doc.value  # Sailor's file holds thousands: the well-formed ones take the short way
    # (the range checks also refuse NaN, infinities and integers too big for a float)
    if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and len(v[0]) == 3 and \
            {type(x) for x in (*v[0], v[1])} <= {int, float} and \
            all(abs(x) <= MAX_COEFF for x in v[0]) and 0 < v[1] <= MAX_RATE:
        return BandwidthFit(float(v[0][0]), float(v[0][1]), float(v[0][2]), float(v[1]))
    coeffs, cap = doc.items(2, 2, "Sailor's fits are [[c0, c1, c2], max bytes/s]")
    return _fit(coeffs, cap)


NUMBER = (int, float)


def _is_fit(v) -> bool:
    """Sailor's [[c0, c1, c2], max bytes/s], each a number in range (NaN fails the comparisons)."""
    if type(v) is not list or len(v) != 2:
        return False
    c, cap = v
    return type(c) is list and len(c) == 3 and type(c[0]) in NUMBER and type(c[1]) in NUMBER and \
        type(c[2]) in NUMBER and type(cap) in NUMBER and -MAX_COEFF <= c[0] <= MAX_COEFF and \
        -MAX_COEFF <= c[1] <= MAX_COEFF and -MAX_COEFF <= c[2] <= MAX_COEFF and 0 < cap <= MAX_RATE


def _fast_inter(value, gpu_name) -> dict | None:
    """The fits of multizone_bandwidths_het.json when every level is an object, every GPU count a key
    from 1 to 65536 and every entry a well-formed fit; None otherwise (the slow way then finds and
    names the mistake). The file holds ten thousand entries: this is the check they take."""
    if type(value) is not dict:
        return None
    out, name = {}, cache(gpu_name)  # Sailor's GPU name -> ours, looked up once each
    for sz, by_gpu in value.items():
        if type(by_gpu) is not dict:
            return None
        for sg, by_n in by_gpu.items():
            if type(by_n) is not dict:
                return None
            src = name(sg)
            for sn, by_dz in by_n.items():
                if type(by_dz) is not dict or not is_int_key(sn, 1, 1 << 16):
                    return None
                n_src = int(sn)
                for dz, by_dg in by_dz.items():
                    if type(by_dg) is not dict:
                        return None
                    for dg, by_dn in by_dg.items():
                        if type(by_dn) is not dict:
                            return None
                        dst = name(dg)
                        for dn, v in by_dn.items():
                            if not (_is_fit(v) and is_int_key(dn, 1, 1 << 16)):
                                return None
                            if dst == src:  # else a copy of another entry (see above)
                                c = v[0]
                                out[(sz, src, n_src, dz, dst, int(dn))] = BandwidthFit(
                                    float(c[0]), float(c[1]), float(c[2]), float(v[1]))
    return out


def _read(path: Path, what: str) -> Doc:
    where = f"{what} {path}"
    return Doc(parse_json(read_text(path, what), where), where)


def load_sailor_network(providers: Path, gpu_name) -> NetworkFits:
    """Read Sailor's providers/ folder; `gpu_name` maps its GPU names to ours."""
    fits = NetworkFits()
    inter_file = providers / "multizone_bandwidths_het.json"
    if inter_file.exists():
        doc = _read(inter_file, "Sailor network fits")
        fast = _fast_inter(doc.value, gpu_name)
        if fast is not None:
            fits.inter.update(fast)
        for sz, by_gpu in doc.entries(NETWORK_HINT) if fast is None else ():
            for sg, by_n in by_gpu.entries(NETWORK_HINT):
                for sn, by_dz in by_n.entries(NETWORK_HINT):
                    n_src = int_key(sn, by_n.source, by_n, 1, 1 << 16)
                    for dz, by_dg in by_dz.entries(NETWORK_HINT):
                        for dg, by_dn in by_dg.entries(NETWORK_HINT):
                            for dn, entry in by_dn.entries(NETWORK_HINT):
                                fit = _sailor_entry(entry)  # every entry is checked, also those not read
                                if gpu_name(dg) == gpu_name(sg):  # else a copy of another entry (see above)
                                    key = (sz, gpu_name(sg), n_src, dz, gpu_name(dg),
                                           int_key(dn, by_dn.source, by_dn, 1, 1 << 16))
                                    fits.inter[key] = fit
        fits.sources.append(str(inter_file))
    intra_file = providers / "intra_node_bandwidths.json"
    if intra_file.exists():
        for g, by_n in _read(intra_file, "Sailor network fits").entries(NETWORK_HINT):
            for n, entry in by_n.entries(NETWORK_HINT):
                fits.intra[(gpu_name(g), int_key(n, by_n.source, by_n, 1, 1 << 16))] = _sailor_entry(entry)
        fits.sources.append(str(intra_file))
    return fits


FIT_FIELDS = ("coeffs", "max_bytes_per_s")
FIT_EXTRA = ("latency_s", "min_bytes", "max_bytes", "allreduce_efficiency")


def load_network_file(path: Path) -> NetworkFits:
    """Read our network.json (written by `sailor profile network`), every fit checked."""
    top = _read(path, "network profile").fields(open_ended=True, hint=NETWORK_HINT)
    fits = NetworkFits(sources=[str(path)])
    if "allreduce" in top:
        top["allreduce"].items(hint=NETWORK_HINT)  # kept as measured, for merges
    for e in top["inter"].items(hint=NETWORK_HINT) if "inter" in top else ():
        f = e.fields(("src_zone", "src_gpu", "src_gpus", "dst_zone", "dst_gpu", "dst_gpus", *FIT_FIELDS),
                     open_ended=True, hint=NETWORK_HINT)
        key = (f["src_zone"].str(), f["src_gpu"].str(), f["src_gpus"].int(1, 1 << 16), f["dst_zone"].str(),
               f["dst_gpu"].str(), f["dst_gpus"].int(1, 1 << 16))
        fits.inter[key] = _fit(f["coeffs"], f["max_bytes_per_s"], f)
    for e in top["intra"].items(hint=NETWORK_HINT) if "intra" in top else ():
        f = e.fields(("gpu", "gpus", *FIT_FIELDS), open_ended=True, hint=NETWORK_HINT)
        fits.intra[(f["gpu"].str(), f["gpus"].int(1, 1 << 16))] = _fit(f["coeffs"], f["max_bytes_per_s"], f)
    return fits
