"""Plots people would rather see than read (matplotlib, PNG, SVG or PDF by the file name)."""
from __future__ import annotations

from collections import Counter

TIMELINE_MICROBATCHES = 256  # a timeline draws at most this many microbatches; more are a solid band anyway
STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]  # lines stay visible where policies coincide


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gpu_mix(plan) -> str:
    """What a plan runs on, in a few words: '32 A100-40 + 16 V100-16 in 2 zones'."""
    by_type: Counter = Counter()
    zones = set()
    for (gpu, zone), n in plan.gpus_used().items():
        by_type[gpu] += n
        zones.add(zone)
    mix = " + ".join(f"{n} {gpu}" for gpu, n in by_type.most_common())
    return mix + (f" in {len(zones)} zones" if len(zones) > 1 else "")


def plot_replay(runs, path: str, title: str = "") -> None:
    """Throughput, cumulative iterations and cumulative cost over time, one line per policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for i, r in enumerate(runs):
        t, thr, iters, cost = replay_series(r)
        line, marker = STYLES[i % len(STYLES)]
        # later policies are drawn thinner on top, so one that coincides with an earlier one still shows
        style = dict(label=r.policy, linestyle=line, linewidth=2.6 - 0.6 * i, alpha=0.85, zorder=2 + i)
        axes[0].step(t, thr, where="post", **style)
        axes[1].plot(t, iters, marker=marker, markersize=4, markevery=max(1, len(t) // 12), **style)
        axes[2].plot(t, cost, marker=marker, markersize=4, markevery=max(1, len(t) // 12), **style)
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


def replay_series(run) -> tuple[list[float], list[float], list[float], list[float]]:
    """(hours, iterations/s, iterations done, USD spent) at each step's start and at the run's end. The
    rate holds from a point to the next (a step plot), so the end repeats the last step's rate."""
    t = [s.start_s / 3600 for s in run.steps] + [run.steps[-1].end_s / 3600]
    thr = [s.iterations / (s.end_s - s.start_s) if s.end_s > s.start_s else 0 for s in run.steps]
    iters, cost = [0.0], [0.0]
    for s in run.steps:
        iters.append(iters[-1] + s.iterations)
        cost.append(cost[-1] + s.cost_usd)
    return t, thr + thr[-1:], iters, cost


def plot_plan(plan, est, sim, path: str, title: str = "") -> None:
    """The slowest pipeline's 1F1B timeline, each stage's gradient sync and the optimizer step after it,
    and memory per stage against capacity; each stage is labelled with the GPUs it runs on."""
    from planner.simulator.timeline import one_f_one_b

    plt = _pyplot()
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(11, 4 + 0.35 * plan.pp + 2))
    fwd, bwd, comm, k = sim.pipeline_costs(plan)
    m = plan.pipelines[k].num_microbatches
    shown = min(m, TIMELINE_MICROBATCHES)
    ops = one_f_one_b(fwd, bwd, comm, shown)
    for op in ops:
        ax_t.barh(op.stage, op.end - op.start, left=op.start, height=0.8,
                  color="#4c72b0" if op.kind == "F" else "#dd8452", edgecolor="white", linewidth=0.3)
    end = max(op.end for op in ops)
    step = est.sync_time_s - max(s.sync_s for s in est.stages)  # the optimizer step after the slowest sync
    for s, st in enumerate(est.stages):
        ax_t.barh(s, st.sync_s, left=end, height=0.8, color="#55a868", edgecolor="white", linewidth=0.3)
        if step > 0:
            ax_t.barh(s, step, left=end + est.sync_time_s - step, height=0.8, color="#8c8c8c", edgecolor="white",
                      linewidth=0.3)
    labels = []
    for s, stage in enumerate(plan.stages):
        r = stage.replicas[k]
        labels.append(f"stage {s}: {r.gpu} TP{r.tp}" + (f" x{plan.dp}" if plan.dp > 1 else "")
                      + (f", {r.zone}" if len({x.zone for x in stage.replicas}) > 1 else ""))
    ax_t.set_yticks(range(plan.pp), labels)
    ax_t.invert_yaxis()
    ax_t.set_xlabel("seconds (blue: forward, orange: backward, green: gradient sync, grey: optimizer step)")
    what = f"{m} microbatches" if shown == m else f"the first {shown} of {m} microbatches"
    ax_t.set_title(title or f"pipeline {k} of {plan.dp}")
    ax_t.text(1.0, 1.01, f"pipeline {k} of {plan.dp}, {what}", transform=ax_t.transAxes, ha="right", va="bottom",
              fontsize=8)
    names = list(est.stages[0].memory_parts)
    bottom = [0.0] * plan.pp
    for name in names:
        vals = [st.memory_parts.get(name, 0.0) / 1e9 for st in est.stages]
        ax_m.bar(range(plan.pp), vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax_m.scatter(range(plan.pp), [st.capacity_bytes / 1e9 for st in est.stages], marker="_", s=400, color="red",
                 label="GPU memory", zorder=3)
    ax_m.set_xticks(range(plan.pp), [f"stage {s}" for s in range(plan.pp)])
    ax_m.set_ylabel("GB per GPU (worst replica)")
    ax_m.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _spaced(xs: list[float], ys: list[float], gap: float = 0.05) -> list[int]:
    """Indices of points at least `gap` apart (in fractions of the axes) from every one kept before."""
    span_x, span_y = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    kept: list[int] = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if all(((x - xs[j]) / span_x) ** 2 + ((y - ys[j]) / span_y) ** 2 >= gap ** 2 for j in kept):
            kept.append(i)
    return kept


def plot_pareto(points, path: str, title: str = "") -> None:
    """Throughput against dollars per iteration of the plans on the Pareto front. Points far enough apart
    to be labelled without overlap are numbered, and the numbers are explained beside the plot (GPU mix,
    stages, replicas)."""
    plt = _pyplot()
    fig, (ax, side) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
    points = sorted(points, key=lambda p: p[1].cost_per_iteration_usd)
    xs = [e.cost_per_iteration_usd for _, e in points]
    ys = [e.throughput_iters_per_s for _, e in points]
    ax.plot(xs, ys, marker="o", markersize=4, zorder=2)
    labelled = _spaced(xs, ys)
    for n, i in enumerate(labelled, 1):
        ax.annotate(str(n), (xs[i], ys[i]), textcoords="offset points", xytext=(6, -10), fontsize=8,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    ax.set_xlabel("USD per iteration")
    ax.set_ylabel("iterations per second")
    ax.set_title(title or "throughput vs cost (Pareto front)", fontsize=10)
    ax.grid(alpha=0.3)
    side.axis("off")
    rows = [f"{n:>2}  {gpu_mix(points[i][0])}, {points[i][0].pp} stage{'s' if points[i][0].pp > 1 else ''} "
            f"x {points[i][0].dp}" for n, i in enumerate(labelled, 1)]
    if len(labelled) < len(points):
        rows.append(f"({len(points) - len(labelled)} more plans between the numbered ones)")
    side.text(0.0, 1.0, "\n".join(rows), va="top", ha="left", family="monospace", fontsize=7,
              transform=side.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
