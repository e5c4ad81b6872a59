"""The PNG plots of bench/compare_planners.py (matplotlib, no display needed).

Out-of-memory picks are drawn as crosses at the throughput they would have
had (hatched bars in bar charts): the paper counts them as failures.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

ORDER = ["sailor", "sailor-paper", "megatron", "varuna", "piper", "amp", "metis", "flashflex", "dtfm"]
COLORS = {"sailor": "#1f3a93", "sailor-paper": "#8c8c8c", "megatron": "#e07b39", "varuna": "#c9a227",
          "piper": "#6a994e", "amp": "#bc4749", "metis": "#7b2cbf", "flashflex": "#2a9d8f", "dtfm": "#8d5524"}
LABELS = {"sailor": "sailor (ours)", "sailor-paper": "Sailor's pick (anchor)"}
DPI = 90


def plot_all(results: dict, folder: Path) -> list[str]:
    written = []
    if "homogeneous" in results:
        written.append(_homogeneous(results["homogeneous"], folder / "homogeneous.png"))
    if "heterogeneous" in results:
        written.append(_bars(results["heterogeneous"], folder / "heterogeneous.png",
                             "Heterogeneous A100-40 + V100-16, one zone"))
    if "geo" in results:
        written.append(_bars(results["geo"], folder / "geo.png", "Geo-distributed A100-40 (OPT-350)"))
    if "mixed" in results:
        written.append(_bars(results["mixed"], folder / "mixed.png", "A few GPUs of two types over three zones"))
    if "geo_vs_het" in results:
        written.append(_geo_vs_het(results["geo_vs_het"], folder / "geo_vs_het.png"))
    if "cost" in results:
        written.append(_cost(results["cost"], folder / "cost.png"))
    if "search_time" in results:
        written.append(_search_time(results["search_time"], folder / "search_time.png"))
    return [str(p) for p in written]


def _planners(rows) -> list[str]:
    present = {k for r in rows for k in r["planners"]}
    return [p for p in ORDER if p in present]


def _homogeneous(rows, path: Path) -> Path:
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 3.9), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        for p in _planners(mine):
            xs, ys, ox, oy = [], [], [], []
            for r in mine:
                v, ours = r["planners"].get(p), r["planners"]["sailor"]
                if not v or "error" in v or "error" in ours:
                    continue
                n = sum(r["cluster"].values())
                (xs if v["fits_in_memory"] else ox).append(n)
                (ys if v["fits_in_memory"] else oy).append(v["throughput_iters_per_s"] / ours["throughput_iters_per_s"])
            ax.plot(xs, ys, marker="o", ms=4, lw=1.6 if p == "sailor" else 1, color=COLORS[p],
                    label=LABELS.get(p, p), ls="--" if p == "sailor-paper" else "-")
            if ox:
                ax.scatter(ox, oy, marker="x", s=45, color=COLORS[p])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("A100-40 GPUs, one zone")
        ax.set_ylabel("throughput / sailor's")
        ax.set_title(f"{model} (x = out of memory)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2, loc="lower left")
    return _save(fig, path)


def _bars(rows, path: Path, title: str) -> Path:
    planners = _planners(rows)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.15 * len(rows) + 3), 4.6))
    width = 0.8 / len(planners)
    for i, p in enumerate(planners):
        for j, r in enumerate(rows):
            v = r["planners"].get(p)
            if not v or "error" in v:
                continue
            ours = r["planners"]["sailor"]["throughput_iters_per_s"]
            x = j + (i - (len(planners) - 1) / 2) * width
            fits = v["fits_in_memory"]
            ax.bar(x, v["throughput_iters_per_s"] / ours, width, color=COLORS[p], hatch=None if fits else "xx",
                   edgecolor="white" if fits else "k")
    handles = [Patch(color=COLORS[p], label=LABELS.get(p, p)) for p in planners]
    handles.append(Patch(facecolor="white", edgecolor="k", hatch="xx", label="out of memory"))
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(["\n".join(textwrap.wrap(r["case"], 16, break_long_words=False)) for r in rows], fontsize=7)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_ylabel("throughput / sailor's")
    ax.set_title(f"{title} (hatched = out of memory)", fontsize=9)
    ax.legend(handles=handles, fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _geo_vs_het(rows, path: Path) -> Path:
    fig, axes = plt.subplots(1, len(rows), figsize=(4.6 * len(rows), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rows):
        labels = list(r["sailor"])
        vals = [r["sailor"][k].get("throughput_iters_per_s", 0) for k in labels]
        ax.bar(range(len(vals)), vals, color=["#8c8c8c", "#bc4749", "#1f3a93", "#2a9d8f"])
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels([k.replace(" ", "\n", 1) for k in labels], fontsize=7)
        ax.set_ylabel("iterations / s (sailor)")
        ax.set_title(f"More GPUs for {r['base_a100']} A100-40: of what kind, where", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _cost(rows, path: Path) -> Path:
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.3 * len(rows)), squeeze=False)
    for (ax_cost, ax_thr), r in zip(axes, rows):
        names, costs, colors, thrs, tcolors, tnames = [], [], [], [], [], []
        ours = r["sailor_min_cost"]
        if "error" not in ours:
            names.append("sailor"), costs.append(ours["cost_per_iteration_usd"]), colors.append(COLORS["sailor"])
        if "sailor_paper_min_cost" in r:
            names.append("Sailor's pick"), costs.append(r["sailor_paper_min_cost"]["cost_per_iteration_usd"])
            colors.append(COLORS["sailor-paper"])
        fast = r["sailor_max_throughput"]
        if "error" not in fast:
            tnames.append("sailor"), thrs.append(fast["throughput_iters_per_s"]), tcolors.append(COLORS["sailor"])
        for b, v in r["baselines_best_of_sweep"].items():
            if v["min_cost"]:
                names.append(b), costs.append(v["min_cost"]["cost_per_iteration_usd"]), colors.append(COLORS[b])
            if v["max_throughput"]:
                tnames.append(b), thrs.append(v["max_throughput"]["throughput_iters_per_s"])
                tcolors.append(COLORS[b])
        ax_cost.bar(range(len(costs)), costs, color=colors)
        ax_cost.set_xticks(range(len(costs)))
        ax_cost.set_xticklabels(names, fontsize=7, rotation=30)
        ax_cost.set_ylabel("USD / iteration")
        ax_cost.set_title(f"{r['case']}: min cost at >= {r['throughput_floor']} it/s\n"
                          "(baselines: best of a sweep of allocations)", fontsize=8)
        ax_thr.bar(range(len(thrs)), thrs, color=tcolors)
        ax_thr.set_xticks(range(len(thrs)))
        ax_thr.set_xticklabels(tnames, fontsize=7, rotation=30)
        ax_thr.set_ylabel("iterations / s")
        ax_thr.set_title(f"max throughput at <= {r['budget_usd_per_iteration']} USD/iteration", fontsize=8)
        for ax in (ax_cost, ax_thr):
            ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _search_time(st, path: Path) -> Path:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, rows, key, xlabel in ((a, st["by_gpus"], "gpus", "A100-40 GPUs (OPT-350)"),
                                  (b, st["by_types"], "types", "GPU types (256 GPUs, OPT-350)")):
        names = [p for p in ORDER if any(p in r for r in rows)]
        for p in names:
            pts = [(r[key], r[p]) for r in rows if r.get(p) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=4, color=COLORS[p], label=LABELS.get(p, p))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("search CPU seconds")
        ax.set_yscale("log")
        if key == "gpus":
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    a.legend(fontsize=7, ncol=2)
    fig.suptitle("Search time (our Python implementations of every planner)", fontsize=9)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
