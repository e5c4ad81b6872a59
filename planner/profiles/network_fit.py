"""Fitting the simulator's network model to measured transfer times (`sailor profile network`).

The simulator moves a message of x bytes over a link in

    t(x) = latency + x / BW(x),   BW(x) [GB/s] = c0*y^2 + c1*y + c2,   y = log2(x / 1e6)

(planner.profiles.network_fits; the quadratic-in-log form of Sailor's fits).
From one-way times t_i of messages x_i we take

  * BW for a given latency: least squares of x_i / (t_i - latency) on y_i,
    weighted so that residuals are relative errors of the time, over the
    messages of at least `min_bytes` (64 KB, as Sailor's fits), and the
    range that was fitted (the quadratic is only trusted inside it: the
    simulator clamps y to it, so smaller messages get the 64 KB bandwidth);
  * the latency: the one whose model reproduces every measured time, small
    messages included, with the least relative error (RMS of log(model /
    measured); searched between 0 and the fastest fitted message's time);
  * the cap: the largest bandwidth the fit saw.

Inter-node fits with n GPUs per side are aggregate bandwidth of n pairs sending
at once, as a function of the message each GPU sends (Sailor's convention);
intra-node fits are per GPU pair.

`network.json` (read by planner.profiles.network_fits.load_network_file):

    {"format": "sailor-network", "version": 1, "created": ..., "software": {...},
     "ranks": [{"rank", "node", "zone", "gpu"}, ...],
     "intra": [{"gpu", "gpus": 2, "coeffs": [c0, c1, c2], "max_bytes_per_s", "latency_s",
                "min_bytes", "max_bytes", "allreduce_efficiency",
                "measured": {"bytes": [...], "seconds": [...], "pairs": n}}],
     "inter": [{"src_zone", "src_gpu", "src_gpus", "dst_zone", "dst_gpu", "dst_gpus", ...same...}],
     "allreduce": [{"group", "ranks", "link", "bytes", "seconds", "ring_model_seconds", "efficiency"}]}

All-reduce: the simulator models a ring all-reduce of G bytes over D ranks as
2(D-1)/D * G / (BW * efficiency) + 2(D-1) * latency. A two-rank all-reduce over
each measured link gives that link's `allreduce_efficiency` (the one at which the
model best matches the all-reduces of 64 KB and more); the larger groups are
reported with their own matching efficiency, for information.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from planner.errors import SailorError
from planner.profiles.network_fits import BandwidthFit

FIT_MIN_BYTES = 64e3  # Sailor fitted its curves on 64 KB .. 1 GB
GOLDEN = (1 + 5 ** 0.5) / 2


@dataclass(frozen=True)
class LinkMeasurement:
    """One-way seconds of one message per GPU pair, by message size, over one kind of link."""

    kind: str  # intra | inter
    src_zone: str
    src_gpu: str
    dst_zone: str
    dst_gpu: str
    gpus: int  # GPU pairs sending at once (1 for intra)
    nbytes: tuple[int, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class LinkFit:
    link: LinkMeasurement
    coeffs: tuple[float, float, float]
    max_bytes_per_s: float
    latency_s: float
    min_bytes: float
    max_bytes: float
    allreduce_efficiency: float | None = None  # measured; see allreduce_efficiency()

    @property
    def bandwidth(self) -> BandwidthFit:
        return BandwidthFit(*self.coeffs, self.max_bytes_per_s, latency_s=self.latency_s,
                            min_bytes=self.min_bytes, max_bytes=self.max_bytes,
                            allreduce_efficiency=self.allreduce_efficiency)

    def seconds(self, nbytes: float) -> float:
        """Modelled one-way time of a message of `nbytes` per GPU pair."""
        return self.latency_s + nbytes / (self.bandwidth.bytes_per_s(nbytes) / self.link.gpus)


def _quadratic(fitted: list[tuple[float, float]], latency: float, pairs: int) -> tuple[np.ndarray, float]:
    """Least-squares BW(y) through x / (t - latency) of the fitted messages; (coefficients, largest BW)."""
    y = np.log2(np.array([x for x, _ in fitted]) / 1e6)
    t = np.array([t for _, t in fitted])
    gbps = np.array([pairs * x / 1e9 for x, _ in fitted]) / (t - latency)  # aggregate over the pairs
    # Weights make the residual the relative error of the modelled *time* (to first order),
    # so a noisy, latency-dominated point cannot pull the curve around.
    weights = (t - latency) / (t * gbps)
    return np.polyfit(y, gbps, 2, w=weights), float(gbps.max() * 1e9)


def _log_error(link: LinkMeasurement, fit: "LinkFit") -> float:
    """RMS of log(modelled / measured time) over every measured size."""
    return float(np.sqrt(np.mean([np.log(fit.seconds(x) / t) ** 2 for x, t in zip(link.nbytes, link.seconds)])))


def fit_link(link: LinkMeasurement, min_bytes: float = FIT_MIN_BYTES) -> LinkFit:
    """The latency and bandwidth curve that reproduce the measured times best (relative error)."""
    if len(link.nbytes) != len(link.seconds) or not link.nbytes:
        raise SailorError("network measurements need as many times as message sizes")
    if any(not math.isfinite(t) or t <= 0 for t in link.seconds):
        raise SailorError(f"network measurement of the {link.kind} link has non-positive or missing times")
    pairs = sorted(zip(link.nbytes, link.seconds))
    fitted = [(x, t) for x, t in pairs if x >= min_bytes]
    if len(fitted) < 3:
        raise SailorError(f"the {link.kind} link needs at least 3 message sizes of {min_bytes / 1e3:g} KB or more "
                          f"to fit, got {len(fitted)}; raise --max-size")
    lo, hi = float(fitted[0][0]), float(fitted[-1][0])

    def candidate(latency: float) -> LinkFit:
        coeffs, cap = _quadratic(fitted, latency, link.gpus)
        return LinkFit(link, tuple(float(c) for c in coeffs), cap, float(latency), lo, hi)

    # The latency is searched on a grid below the fastest fitted message (so every
    # bandwidth stays positive), then refined around the best grid point.
    top = 0.98 * min(t for _, t in fitted)
    grid = np.linspace(0.0, top, 99)
    best = min(grid, key=lambda lat: _log_error(link, candidate(lat)))
    step = grid[1] - grid[0]
    fine = np.linspace(max(0.0, best - step), min(top, best + step), 41)
    return candidate(min(fine, key=lambda lat: _log_error(link, candidate(lat))))


@dataclass(frozen=True)
class AllReduceMeasurement:
    group: str  # what the ranks are: "intra-node", "one rank per node", "world"
    ranks: tuple[int, ...]
    link: str  # the slowest link kind in the ring: intra | inter
    nbytes: tuple[int, ...]
    seconds: tuple[float, ...]


def ring_model_seconds(fit: LinkFit, nbytes: float, members: int, efficiency: float = 1.0) -> float:
    """The simulator's ring all-reduce of `nbytes` over `members` ranks joined by links like `fit`
    (planner.simulator.network.Network.allreduce_time)."""
    volume = 2 * (members - 1) / members * nbytes
    return volume / (fit.bandwidth.bytes_per_s(nbytes / members) * efficiency) + 2 * (members - 1) * fit.latency_s


def allreduce_efficiency(fit: LinkFit, m: AllReduceMeasurement) -> float | None:
    """The efficiency at which the ring model matches the measured all-reduces of 64 KB and more
    best: it minimises sum(log(model / measured)^2) over [1e-3, 1e3]. An all-reduce that ran faster
    than the model's latency terms alone (a busy host's noisy latency fit) pulls it up rather than
    being dropped. None if no all-reduce of 64 KB or more was measured."""
    d = len(m.ranks)
    points = [(x, t) for x, t in zip(m.nbytes, m.seconds) if x >= FIT_MIN_BYTES and t > 0]
    if not points:
        return None

    def error(log_eff: float) -> float:
        eff = 10.0 ** log_eff
        return sum(math.log(ring_model_seconds(fit, x, d, eff) / t) ** 2 for x, t in points)

    grid = np.linspace(-3.0, 3.0, 121)
    i = int(np.argmin([error(u) for u in grid]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    for _ in range(80):  # golden-section search inside the best grid cell's neighbours
        a, b = hi - (hi - lo) / GOLDEN, lo + (hi - lo) / GOLDEN
        lo, hi = (lo, b) if error(a) < error(b) else (a, hi)
    return float(10.0 ** ((lo + hi) / 2))


def with_allreduce(fit: LinkFit, m: AllReduceMeasurement | None) -> LinkFit:
    return replace(fit, allreduce_efficiency=allreduce_efficiency(fit, m)) if m is not None else fit


def allreduce_entry(m: AllReduceMeasurement, fit: LinkFit | None) -> dict:
    """The measurement, what the ring model says at full efficiency, and the efficiency that matches."""
    entry = {"group": m.group, "ranks": list(m.ranks), "link": m.link, "bytes": list(m.nbytes),
             "seconds": list(m.seconds)}
    if fit is not None:
        entry["ring_model_seconds"] = [ring_model_seconds(fit, x, len(m.ranks)) for x in m.nbytes]
        entry["efficiency"] = allreduce_efficiency(fit, m)
    return entry


def link_entry(f: LinkFit) -> dict:
    link = f.link
    entry = {"coeffs": list(f.coeffs), "max_bytes_per_s": f.max_bytes_per_s, "latency_s": f.latency_s,
             "min_bytes": f.min_bytes, "max_bytes": f.max_bytes, "allreduce_efficiency": f.allreduce_efficiency,
             "measured": {"bytes": list(link.nbytes), "seconds": list(link.seconds), "pairs": link.gpus}}
    if link.kind == "intra":
        return {"gpu": link.src_gpu, "gpus": 2, **entry}
    return {"src_zone": link.src_zone, "src_gpu": link.src_gpu, "src_gpus": link.gpus,
            "dst_zone": link.dst_zone, "dst_gpu": link.dst_gpu, "dst_gpus": link.gpus, **entry}


def network_document(fits: list[LinkFit], allreduce: list[dict], meta: dict) -> dict:
    """network.json: inter-node fits in both directions (the measurement is a ping-pong)."""
    doc = {"format": "sailor-network", "version": 1, **meta, "intra": [], "inter": [], "allreduce": allreduce}
    for f in fits:
        if f.link.kind == "intra":
            doc["intra"].append(link_entry(f))
            continue
        doc["inter"].append(link_entry(f))
        m = f.link
        if (m.src_zone, m.src_gpu) != (m.dst_zone, m.dst_gpu):
            back = LinkMeasurement(m.kind, m.dst_zone, m.dst_gpu, m.src_zone, m.src_gpu, m.gpus, m.nbytes, m.seconds)
            doc["inter"].append(link_entry(replace(f, link=back)))
    return doc


def write_network(doc: dict, path: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    return out


def plot_network(fits: list[LinkFit], path: str, title: str = "") -> None:
    """Measured bandwidth (points) and the fitted model (line) of every link, one panel each."""
    from planner.plots import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(len(fits), 1, figsize=(7, 3.2 * len(fits)), squeeze=False)
    for ax, f in zip(axes[:, 0], fits):
        m = f.link
        xs = np.array(m.nbytes, dtype=float)
        ax.loglog(xs, xs / np.array(m.seconds) / 1e9, "o", label="measured")
        grid = np.geomspace(xs.min(), xs.max(), 200)
        ax.loglog(grid, grid / np.array([f.seconds(x) for x in grid]) / 1e9, "-",
                  label=f"model: {f.latency_s * 1e6:.0f} us + x / BW(x)")
        ax.axvspan(f.min_bytes, f.max_bytes, color="0.9", zorder=0, label="fitted range")
        where = f"{m.src_gpu}" if m.kind == "intra" else f"{m.src_zone} -> {m.dst_zone}, {m.gpus} pair(s)"
        ax.set_title(f"{m.kind}: {where}")
        ax.set_xlabel("message bytes (per GPU pair)")
        ax.set_ylabel("GB/s per pair")
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
