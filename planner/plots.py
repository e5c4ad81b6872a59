"""Plots people would rather see than read (matplotlib, PNG or SVG by the file name)."""
from __future__ import annotations


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_replay(runs, path: str, title: str = "") -> None:
    """Throughput, cumulative iterations and cumulative cost over time, one line per policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for r in runs:
        t = [s.start_s / 3600 for s in r.steps] + [r.steps[-1].end_s / 3600]
        thr = [s.iterations / (s.end_s - s.start_s) if s.end_s > s.start_s else 0 for s in r.steps]
        iters, cost = [0.0], [0.0]
        for s in r.steps:
            iters.append(iters[-1] + s.iterations)
            cost.append(cost[-1] + s.cost_usd)
        axes[0].step(t[:-1], thr, where="post", label=r.policy)
        axes[1].plot(t, iters, label=r.policy)
        axes[2].plot(t, cost, label=r.policy)
    axes[0].set_ylabel("iterations / s")
    axes[1].set_ylabel("iterations done")
    axes[2].set_ylabel("cost (USD)")
    axes[2].set_xlabel("hours")
    axes[0].legend()
    if title:
        axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
