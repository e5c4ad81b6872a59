"""Human-readable tables for the CLI (rich); JSON output lives in the commands."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.provenance import conversion_note, footnotes

GB = 1e9


def _gpus(d: dict[str, int]) -> str:
    return ", ".join(f"{n}x {k}" for k, n in d.items())


def console() -> Console:
    import sys

    return Console(highlight=False, width=None if sys.stdout.isatty() else 150)


MARK = "~"  # beside a number that rests on an estimate (planner/provenance.py)


def _mark(text: str, estimated: bool) -> str:
    return f"{MARK}{text}" if estimated else text


def print_estimate(est, title: str = "", provenance=None) -> None:
    """One plan's prediction; `provenance` (planner.provenance.Provenance) marks what is estimated."""
    time_est = bool(provenance and provenance.time)
    mem_est = bool(provenance and provenance.memory)
    out = console()
    t = Table(title=title or None, title_justify="left")
    recompute = any(s.recompute for s in est.stages)
    for col in ("stage", "layers", "GPUs", "TP", "compute/mb", "grad sync", "memory / capacity", "fits") + \
            (("recompute",) if recompute else ()):
        t.add_column(col, justify="right" if col not in ("GPUs", "TP") else "left")
    for s in est.stages:
        tps = sorted(set(s.tp))
        on_estimate = bool(provenance) and any(key.split("@")[0] in provenance.gpus for key in s.gpus)
        t.add_row(str(s.index), f"{s.layers[0]}-{s.layers[1]}", _gpus(s.gpus), ",".join(map(str, tps)),
                  _mark(f"{s.compute_s * 1e3:.1f} ms", on_estimate), f"{s.sync_s * 1e3:.1f} ms",
                  _mark(f"{s.memory_bytes / GB:.1f} / {s.capacity_bytes / GB:.1f} GB", on_estimate and mem_est),
                  "yes" if s.fits else "[red]NO[/]",
                  *(("yes" if s.recompute else "no",) if recompute else ()))
    out.print(t)
    out.print(f"iteration time   {_mark(f'{est.iteration_time_s:.3f}', time_est)} s  "
              f"({est.throughput_iters_per_s:.3f} it/s, "
              f"{est.tokens_per_s:,.0f} tokens/s; pipeline {est.pipeline_time_s:.3f} s + sync/step "
              f"{est.sync_time_s:.3f} s)")
    out.print(f"peak memory      {_mark(f'{est.peak_memory_bytes / GB:.2f}', mem_est)} GB per GPU"
              + ("" if est.fits_in_memory else "  [red]does not fit[/]"))
    out.print(f"cost             {_mark(f'${est.cost_per_iteration_usd:.4f}', time_est)}/iteration (egress "
              f"${est.egress_cost_per_iteration_usd:.4f}), "
              f"{_mark(f'${est.cost_per_hour_usd:.2f}', time_est and est.egress_cost_per_iteration_usd > 0)}/hour, "
              f"${est.cost_per_million_tokens_usd:.3f}/1M tokens")
    out.print(f"GPUs             {_gpus(est.gpus_used)}")
    for what, src in est.sources.items():
        out.print(f"[dim]{what}: {src}[/]")
    _footnotes(out, [provenance])


def _footnotes(out, provenances) -> None:
    note = conversion_note(provenances)
    if note:
        out.print(f"[dim]{escape(note)}[/]", soft_wrap=True)
    for line in footnotes(provenances):
        out.print(f"{MARK} {line}", soft_wrap=True)


def print_plans(plans, title: str = "", provenances=None) -> None:
    """The top plans (or a Pareto front), one row each; `provenances` (one per plan) mark
    the numbers that rest on estimates."""
    provenances = provenances or [None] * len(plans)
    out = console()
    t = Table(title=title or None, title_justify="left")
    for col in ("#", "it/s", "iter time", "$/iter", "$/hour", "GPUs", "stages x TP x replicas", "mbs",
                "peak mem / cap"):
        t.add_column(col, justify="left" if col in ("GPUs", "stages x TP x replicas") else "right")
    for i, ((plan, est), prov) in enumerate(zip(plans, provenances), 1):
        time_est, mem_est = bool(prov and prov.time), bool(prov and prov.memory)
        shape = " | ".join(f"{s.last - s.first + 1}L tp{'/'.join(map(str, sorted({r.tp for r in s.replicas})))} "
                           f"x{len(s.replicas)}" + (" rc" if s.recompute else "") for s in plan.stages)
        worst = max(est.stages, key=lambda s: s.memory_bytes / s.capacity_bytes)
        hourly_est = time_est and est.egress_cost_per_iteration_usd > 0  # else GPUs x prices: exact
        t.add_row(str(i), _mark(f"{est.throughput_iters_per_s:.3f}", time_est),
                  _mark(f"{est.iteration_time_s:.3f} s", time_est),
                  _mark(f"{est.cost_per_iteration_usd:.4f}", time_est),
                  _mark(f"{est.cost_per_hour_usd:.2f}", hourly_est), _gpus(est.gpus_used), shape,
                  ",".join(sorted({str(p.microbatch_size) for p in plan.pipelines})),
                  _mark(f"{worst.memory_bytes / GB:.1f} / {worst.capacity_bytes / GB:.1f} GB", mem_est))
    out.print(t)
    _footnotes(out, provenances)


def print_replay(runs, title: str = "") -> None:
    out = console()
    t = Table(title=title or None, title_justify="left")
    for col in ("policy", "iterations", "cost $", "$ / iteration", "mean it/s", "restarts"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in runs:
        s = r.summary()
        t.add_row(s["policy"], f"{s['iterations']:.1f}", f"{s['cost_usd']:.2f}",
                  f"{s['usd_per_iteration']:.4f}" if s["usd_per_iteration"] else "-",
                  f"{s['mean_throughput_iters_per_s']:.4f}", str(s["restarts"]))
    out.print(t)
