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


def plot_plan(plan, est, sim, path: str, title: str = "") -> None:
    """Pipeline timeline (1F1B, the slowest pipeline) and memory per stage against capacity."""
    from planner.simulator.timeline import one_f_one_b

    plt = _pyplot()
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(10, 4 + 0.35 * plan.pp + 2))
    fwd, bwd, comm, k = sim.pipeline_costs(plan)
    ops = one_f_one_b(fwd, bwd, comm, plan.pipelines[k].num_microbatches)
    for op in ops:
        ax_t.barh(op.stage, op.end - op.start, left=op.start, height=0.8,
                  color="#4c72b0" if op.kind == "F" else "#dd8452", edgecolor="white", linewidth=0.3)
    ax_t.set_yticks(range(plan.pp), [f"stage {s}" for s in range(plan.pp)])
    ax_t.invert_yaxis()
    ax_t.set_xlabel("seconds (blue: forward, orange: backward)")
    ax_t.set_title(title or f"pipeline {k} of {plan.dp}: {plan.pipelines[k].num_microbatches} microbatches")
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


def plot_pareto(points, path: str, title: str = "") -> None:
    """Throughput against dollars per iteration of the plans on the Pareto front."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [e.cost_per_iteration_usd for _, e in points]
    ys = [e.throughput_iters_per_s for _, e in points]
    ax.plot(xs, ys, marker="o")
    for (plan, est), x, y in zip(points, xs, ys):
        ax.annotate(f"{plan.num_gpus} GPUs", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("USD per iteration")
    ax.set_ylabel("iterations per second")
    ax.set_title(title or "throughput vs cost (Pareto front)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
