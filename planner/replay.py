"""What-if: replay a GPU-availability trace through the planner and the simulator.

A trace is a list of snapshots (time, GPUs available per type and zone). Over
each interval between snapshots a policy holds one plan; when availability
changes it may re-plan, paying `restart_s` seconds of no progress (the GPUs
are paid for all the same). Policies:

  * sailor        re-plan with the full planner on every change; switch when
                  the new plan is faster or the old one lost its GPUs;
  * homogeneous   the same, but only plans on one GPU type in one zone
                  (what a homogeneous framework can run);
  * static        one plan for the GPUs available all the time (the minimum
                  over the trace per pool); never restarts.

Per interval of length dt with a plan of iteration time T:
    iterations = max(0, dt - restart) / T
    cost       = dt * GPUs used * price / 3600 + iterations * egress per iteration
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import SailorError
from planner.inputs import MAX_COUNT, Doc, parse_json, read_text, short
from planner.specs.hardware import Pool

POLICIES = ("sailor", "homogeneous", "static")


@dataclass(frozen=True)
class Snapshot:
    time_s: float  # since the start of the trace
    pools: tuple[Pool, ...]

    @property
    def gpus(self) -> int:
        return sum(p.count for p in self.pools)


MAX_SNAPSHOTS = 100_000


def load_trace(path: str, gpu: str | None = None, zone: str | None = None, cluster=None) -> list[Snapshot]:
    """Sailor's traces: CSV `,Timestamp,<GPU>_<zone>,...` or JSON `[{"Time": s, "GPUs": n}]` of `gpu` in `zone`
    (default A100-40 in us-central1-a), every value checked."""
    from planner.specs.hardware import Cluster

    cluster = cluster or Cluster()
    where = f"trace {path}"
    text = read_text(path, "trace")
    snaps = []
    if Path(path).suffix == ".json":
        gpu = cluster.gpu(gpu or "A100-40").name
        zone = cluster.check_zone(zone or "us-central1-a", "--zone")
        hint = 'a JSON trace is [{"Time": seconds, "GPUs": count}, ...]'
        for row in Doc(parse_json(text, where), where).items(1, MAX_SNAPSHOTS, hint):
            f = row.fields(("Time", "GPUs"), hint=hint)
            snaps.append(Snapshot(f["Time"].number(0, 1e12), (Pool(gpu, zone, f["GPUs"].int(0, MAX_COUNT)),)))
    else:
        if gpu is not None:  # (it was ignored)
            raise SailorError("--gpu is for JSON traces; a CSV trace names the GPU type of each column in its header: "
                              "drop the flag")
        expected = "Sailor's CSV trace: a header ',Timestamp,GPU_zone,...' and one row per snapshot"
        reader = csv.reader(text.splitlines())
        rows = []  # (line, fields), so messages name the line an editor shows
        try:
            for r in reader:
                if r:
                    rows.append((reader.line_num, r))
        except csv.Error as e:
            problem = f"has a field longer than {csv.field_size_limit()} characters" \
                if "field limit" in str(e) else f"is not CSV ({e})"
            raise SailorError(f"{where}: line {reader.line_num} {problem}; give {expected}") from None
        header, rows = rows[0][1], rows[1:]
        if len(header) < 3 or not rows:
            raise SailorError(f"{where}: expected {expected}")
        if header[1].strip().lower() != "timestamp":  # else a GPU column would be read as the time
            raise SailorError(f"{where}: the header's second column is {short(header[1])}, not Timestamp; "
                              f"give {expected}")
        cols = []
        for name in header[2:]:
            g, _, z = name.partition("_")
            z = cluster.check_zone(z, f"{where}: column {short(name)}") if z else \
                cluster.check_zone("us-central1-a" if zone is None else zone,
                                   f"--zone (the zone of column {short(name)} of {where})")
            cols.append((cluster.gpu(g).name, z))
        if zone is not None and all("_" in name for name in header[2:]):  # (it was ignored)
            raise SailorError(f"--zone is for JSON traces and CSV columns without one, and every column of {where} "
                              "names its zone: drop the flag")
        if len(rows) > MAX_SNAPSHOTS:
            raise SailorError(f"{where} has {len(rows)} snapshots, more than the {MAX_SNAPSHOTS} a replay takes")
        t0 = last = None
        for i, row in rows:
            if len(row) != len(header):
                raise SailorError(f"{where}: line {i} has {len(row)} fields but the header has {len(header)}")
            t = _csv_number(row[1], where, i, "Timestamp", 1e12)
            counts = [_csv_number(n, where, i, name, MAX_COUNT, integral=True) for n, name in zip(row[2:], header[2:])]
            if last is not None and t < last[0]:
                raise SailorError(f"{where}: line {i} goes back in time ({short(row[1])} before {short(last[2])} on "
                                  f"line {last[1]}); give the snapshots in time order")
            t0 = t if t0 is None else t0
            last = (t, i, row[1])
            snaps.append(Snapshot(t - t0, tuple(Pool(g, z, int(n)) for (g, z), n in zip(cols, counts))))
    return sorted(snaps, key=lambda s: s.time_s)


_DECIMAL = re.compile(r"[ \t]*(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t]*")


def _csv_number(text: str, where: str, line: int, column: str, hi: float, integral: bool = False) -> float:
    # float() also takes '1_0', '٣' (an Arabic-Indic 3) and 'nan': a trace holds plain ASCII decimals
    value = float(text) if _DECIMAL.fullmatch(text) else math.nan
    if not (math.isfinite(value) and 0 <= value <= hi) or (integral and not value.is_integer()):
        kind = "a whole number" if integral else "a number"
        raise SailorError(f"{where}: line {line}, column {column}: {short(text)} is not {kind} from 0 to {hi:g}")
    return value


@dataclass
class Step:
    start_s: float
    end_s: float
    gpus_available: int
    gpus_used: int
    iteration_time_s: float | None
    iterations: float
    cost_usd: float
    restarted: bool
    plan: str = ""


@dataclass
class Replay:
    policy: str
    steps: list[Step] = field(default_factory=list)

    @property
    def iterations(self) -> float:
        return sum(s.iterations for s in self.steps)

    @property
    def cost_usd(self) -> float:
        return sum(s.cost_usd for s in self.steps)

    def summary(self) -> dict:
        duration = self.steps[-1].end_s - self.steps[0].start_s if self.steps else 0.0
        return {"policy": self.policy, "iterations": round(self.iterations, 2), "cost_usd": round(self.cost_usd, 4),
                "usd_per_iteration": round(self.cost_usd / self.iterations, 5) if self.iterations else None,
                "mean_throughput_iters_per_s": round(self.iterations / duration, 5) if duration else 0.0,
                "restarts": sum(s.restarted for s in self.steps)}


def _describe(plan) -> str:
    used = plan.gpus_used()
    gpus = ", ".join(f"{n}x{g}@{z}" for (g, z), n in sorted(used.items()))
    return f"pp{plan.pp} dp{plan.dp} mbs{plan.pipelines[0].microbatch_size}: {gpus}"


def _fits(plan, pools: tuple[Pool, ...]) -> bool:
    have = {(p.gpu, p.zone): p.count for p in pools}
    return all(have.get(k, 0) >= n for k, n in plan.gpus_used().items())


def replay(trace: list[Snapshot], plan_for, policy: str, restart_s: float, tail_s: float | None = None) -> Replay:
    """Run one policy over the trace. `plan_for(pools, homogeneous)` -> (plan, estimate) or None."""
    if policy not in POLICIES:
        raise SailorError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    ends = [s.time_s for s in trace[1:]]
    gaps = [b - a for a, b in zip([s.time_s for s in trace], ends)]
    ends.append(trace[-1].time_s + (tail_s if tail_s is not None else (sum(gaps) / len(gaps) if gaps else 3600.0)))
    out = Replay(policy)
    current = None
    if policy == "static":
        floor = {}
        pools = {(p.gpu, p.zone) for s in trace for p in s.pools}  # once: per snapshot it made replay quadratic
        for snap in trace:
            have = {}
            for p in snap.pools:
                have[(p.gpu, p.zone)] = have.get((p.gpu, p.zone), 0) + p.count
            for k in pools:
                floor[k] = min(floor.get(k, have.get(k, 0)), have.get(k, 0))
        current = plan_for(tuple(Pool(g, z, n) for (g, z), n in floor.items() if n > 0), False)
    last_pools = None
    for snap, end in zip(trace, ends):
        restarted = False
        if policy != "static" and snap.pools != last_pools:
            best = plan_for(snap.pools, policy == "homogeneous")
            lost = current is not None and not _fits(current[0], snap.pools)
            faster = best is not None and (current is None or
                                           best[1].iteration_time_s < current[1].iteration_time_s * 0.99)
            if lost or faster:
                restarted = current is not None or best is not None
                current = best if (faster or lost) else current
        last_pools = snap.pools
        dt = end - snap.time_s
        if current is None:
            out.steps.append(Step(snap.time_s, end, snap.gpus, 0, None, 0.0, 0.0, restarted))
            continue
        plan, est = current
        busy = max(0.0, dt - (restart_s if restarted else 0.0))
        iters = busy / est.iteration_time_s
        usd_per_s = est.compute_cost_per_iteration_usd / est.iteration_time_s
        cost = dt * usd_per_s + iters * est.egress_cost_per_iteration_usd
        out.steps.append(Step(snap.time_s, end, snap.gpus, plan.num_gpus, est.iteration_time_s, iters, cost,
                              restarted, _describe(plan)))
    return out


def planner_for(sim_factory, global_batch: int, goal, runtime: str = "sailor"):
    """plan_for(pools, homogeneous) backed by the planner, cached by availability."""
    from planner.search.planner import Planner

    cache: dict = {}

    def plan_for(pools: tuple[Pool, ...], homogeneous: bool):
        key = (tuple(sorted((p.gpu, p.zone, p.count) for p in pools if p.count > 0)), homogeneous)
        if key in cache:
            return cache[key]
        candidates = [tuple(p for p in pools if p.count > 0)]
        if homogeneous:  # one GPU type in one zone: the best such pool
            candidates = [(p,) for p in pools if p.count > 0]
        best = None
        for cand in candidates:
            if not cand:
                continue
            sim = sim_factory(cand)
            result = Planner(sim, global_batch, goal, runtime, two_pools=not homogeneous).run(top=1)
            if result.plans and (best is None or goal.score_estimate(result.plans[0][1]) < goal.score_estimate(best[1])):
                best = result.plans[0]
        cache[key] = best
        return best

    return plan_for
