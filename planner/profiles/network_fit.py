"""Fitting the simulator's network model to measured transfer times (`sailor profile network`).

The simulator moves a message of x bytes over a link in

    t(x) = latency + x / BW(x),   BW(x) [GB/s] = c0*y^2 + c1*y + c2,   y = log2(x / 1e6)

(planner.profiles.network_fits; the quadratic-in-log form of Sailor's fits).
From one-way times t_i of messages x_i we take

  * latency: the time of the smallest message (1 KB: all latency), but at most
    half the time of the smallest fitted message, so the bandwidth left is
    never swamped by noise in a latency estimate;
  * BW: least squares of x_i / (t_i - latency) on y_i over the messages of at
    least `min_bytes` (64 KB, as Sailor's fits), and the range that was fitted
    (the quadratic is only trusted inside it: the simulator clamps y to it);
  * the cap: the largest bandwidth measured.

Inter-node fits with n GPUs per side are aggregate bandwidth of n pairs sending
at once, as a function of the message each GPU sends (Sailor's convention);
intra-node fits are per GPU pair.

`network.json` (read by planner.profiles.network_fits.load_network_file):

    {"format": "sailor-network", "version": 1, "created": ..., "software": {...},
     "ranks": [{"rank", "node", "zone", "gpu"}, ...],
     "intra": [{"gpu", "gpus": 2, "coeffs": [c0, c1, c2], "max_bytes_per_s", "latency_s",
                "min_bytes", "max_bytes", "measured": {"bytes": [...], "seconds": [...]}}],
     "inter": [{"src_zone", "src_gpu", "src_gpus", "dst_zone", "dst_gpu", "dst_gpus", ...same...}],
     "allreduce": [{"group", "ranks", "link", "bytes", "seconds", "ring_model_seconds", "efficiency"}]}
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import SailorError
from planner.profiles.network_fits import BandwidthFit

FIT_MIN_BYTES = 64e3  # Sailor fitted its curves on 64 KB .. 1 GB


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

    @property
    def bandwidth(self) -> BandwidthFit:
        return BandwidthFit(*self.coeffs, self.max_bytes_per_s, latency_s=self.latency_s,
                            min_bytes=self.min_bytes, max_bytes=self.max_bytes)

    def seconds(self, nbytes: float) -> float:
        """Modelled one-way time of a message of `nbytes` per GPU pair."""
        return self.latency_s + nbytes / (self.bandwidth.bytes_per_s(nbytes) / self.link.gpus)


def fit_link(link: LinkMeasurement, min_bytes: float = FIT_MIN_BYTES) -> LinkFit:
    if len(link.nbytes) != len(link.seconds) or not link.nbytes:
        raise SailorError("network measurements need as many times as message sizes")
    if any(t <= 0 or not math.isfinite(t) for t in link.seconds):
        raise SailorError(f"network measurement of the {link.kind} link has non-positive or missing times")
    pairs = sorted(zip(link.nbytes, link.seconds))
    fitted = [(x, t) for x, t in pairs if x >= min_bytes]
    if len(fitted) < 3:
        raise SailorError(f"the {link.kind} link needs at least 3 message sizes of {min_bytes / 1e3:g} KB or more "
                          f"to fit, got {len(fitted)}; raise --max-size")
    latency = min(pairs[0][1], 0.5 * min(t for _, t in fitted)) if pairs[0][0] < min_bytes else 0.0
    y = np.log2(np.array([x for x, _ in fitted]) / 1e6)
    gbps = np.array([link.gpus * x / (t - latency) / 1e9 for x, t in fitted])  # aggregate over the pairs
    c0, c1, c2 = np.polyfit(y, gbps, 2)
    return LinkFit(link, (float(c0), float(c1), float(c2)), float(gbps.max() * 1e9), float(latency),
                   float(fitted[0][0]), float(fitted[-1][0]))


@dataclass(frozen=True)
class AllReduceMeasurement:
    group: str  # what the ranks are: "intra-node", "one rank per node", "world"
    ranks: tuple[int, ...]
    link: str  # the slowest link kind in the ring: intra | inter
    nbytes: tuple[int, ...]
    seconds: tuple[float, ...]


def ring_model_seconds(fit: LinkFit, nbytes: float, members: int) -> float:
    """The simulator's ring all-reduce over links like `fit`, at full efficiency."""
    volume = 2 * (members - 1) / members * nbytes
    step = nbytes / members
    return volume / fit.bandwidth.bytes_per_s(step) + 2 * (members - 1) * fit.latency_s


def allreduce_entry(m: AllReduceMeasurement, fit: LinkFit | None) -> dict:
    """The measurement, what the ring model says, and their ratio (the all-reduce efficiency)."""
    entry = {"group": m.group, "ranks": list(m.ranks), "link": m.link, "bytes": list(m.nbytes),
             "seconds": list(m.seconds)}
    if fit is not None:
        model = [ring_model_seconds(fit, x, len(m.ranks)) for x in m.nbytes]
        entry["ring_model_seconds"] = model
        big = [mo / t for x, mo, t in zip(m.nbytes, model, m.seconds) if x >= FIT_MIN_BYTES]
        entry["efficiency"] = float(np.median(big)) if big else None
    return entry


def link_entry(f: LinkFit) -> dict:
    l = f.link
    entry = {"coeffs": list(f.coeffs), "max_bytes_per_s": f.max_bytes_per_s, "latency_s": f.latency_s,
             "min_bytes": f.min_bytes, "max_bytes": f.max_bytes,
             "measured": {"bytes": list(l.nbytes), "seconds": list(l.seconds), "pairs": l.gpus}}
    if l.kind == "intra":
        return {"gpu": l.src_gpu, "gpus": 2, **entry}
    return {"src_zone": l.src_zone, "src_gpu": l.src_gpu, "src_gpus": l.gpus,
            "dst_zone": l.dst_zone, "dst_gpu": l.dst_gpu, "dst_gpus": l.gpus, **entry}


def network_document(fits: list[LinkFit], allreduce: list[dict], meta: dict) -> dict:
    """network.json: inter-node fits in both directions (the measurement is a ping-pong)."""
    doc = {"format": "sailor-network", "version": 1, **meta, "intra": [], "inter": [], "allreduce": allreduce}
    for f in fits:
        if f.link.kind == "intra":
            doc["intra"].append(link_entry(f))
            continue
        doc["inter"].append(link_entry(f))
        l = f.link
        if (l.src_zone, l.src_gpu) != (l.dst_zone, l.dst_gpu):
            back = LinkMeasurement(l.kind, l.dst_zone, l.dst_gpu, l.src_zone, l.src_gpu, l.gpus, l.nbytes, l.seconds)
            doc["inter"].append(link_entry(LinkFit(back, f.coeffs, f.max_bytes_per_s, f.latency_s, f.min_bytes,
                                                   f.max_bytes)))
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
        l = f.link
        xs = np.array(l.nbytes, dtype=float)
        ax.loglog(xs, xs / np.array(l.seconds) / 1e9, "o", label="measured")
        grid = np.geomspace(xs.min(), xs.max(), 200)
        ax.loglog(grid, grid / np.array([f.seconds(x) for x in grid]) / 1e9, "-",
                  label=f"model: {f.latency_s * 1e6:.0f} us + x / BW(x)")
        ax.axvspan(f.min_bytes, f.max_bytes, color="0.9", zorder=0, label="fitted range")
        where = f"{l.src_gpu}" if l.kind == "intra" else f"{l.src_zone} -> {l.dst_zone}, {l.gpus} pair(s)"
        ax.set_title(f"{l.kind}: {where}")
        ax.set_xlabel("message bytes (per GPU pair)")
        ax.set_ylabel("GB/s per pair")
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
