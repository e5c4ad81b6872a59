"""Which numbers of a plan rest on estimates, and how to measure them instead.

A GPU type without a measured profile of the model gets an analytical one
(planner/profiles/estimate.py): the time of every layer it runs is then an
estimate, and so are the plan's iteration time, throughput and cost per
iteration. Its memory facts are measured when any measured profile of the
model has them (they do not depend on the GPU), else estimated too. A
measured profile without an optimizer-step time (Sailor's A100-80 files)
gets an estimated one. A measured profile of another precision or runtime
(Sailor's: fp32, Megatron-DeepSpeed) is converted by the estimator's ratios
(planner/profiles/convert.py): said too, without the estimate's mark. `sailor
plan` and `sailor simulate` show all of it, in tables (report.py) and JSON,
from `provenance`.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.profiles.profile import ESTIMATED


@dataclass(frozen=True)
class Provenance:
    """The estimated parts of one plan's prediction."""

    model: str  # as the commands name it
    precision: str
    gpus: tuple[str, ...]  # GPU types whose layer times are estimated
    layers: tuple[tuple[int, int], ...]  # layer ranges (first, last) some estimated GPU runs
    all_layers: bool  # those ranges cover the whole model
    memory: bool  # some GPU's memory facts are estimated
    optimizer: tuple[str, ...]  # GPU types with a measured profile but an estimated optimizer step
    points: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # (GPU, microbatch sizes, TPs) estimated
    converted: tuple[tuple[str, str, str], ...] = ()  # (GPU, precision, runtime) of measured profiles converted

    @property
    def time(self) -> bool:
        """Iteration time, throughput and cost per iteration rest on an estimate."""
        return bool(self.gpus or self.optimizer)

    def layer_text(self) -> str:
        return "all layers" if self.all_layers else "layers " + ", ".join(
            f"{a}-{b}" if a != b else str(a) for a, b in self.layers)

    def to_dict(self) -> dict:
        return {"gpus": list(self.gpus), "layers": "all" if self.all_layers else [list(r) for r in self.layers],
                "memory": self.memory, "optimizer": list(self.optimizer), "how_to_profile": commands([self]),
                "converted": [{"gpu": g, "measured_precision": p, "measured_runtime": r} for g, p, r in self.converted]}


def _ranges(layers: set[int]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for layer in sorted(layers):
        if out and layer == out[-1][1] + 1:
            out[-1][1] = layer
        else:
            out.append([layer, layer])
    return tuple((a, b) for a, b in out)


def provenance(sim, plan, model_ref: str | None = None) -> Provenance:
    """What in `sim`'s prediction of `plan` is estimated; `model_ref` names the model in the
    commands (default: its name)."""
    points: dict[str, tuple[set[int], set[int]]] = {}  # gpu -> (microbatch sizes, TP degrees)
    layers: set[int] = set()
    memory = False
    optimizer: set[str] = set()
    converted: set[tuple[str, str, str]] = set()
    all_sizes = {pipe.microbatch_size for pipe in plan.pipelines}
    for stage in plan.stages:
        for k, r in enumerate(stage.replicas):  # replica k belongs to pipeline k
            p = sim.profile(r.gpu)
            if p.source == ESTIMATED:
                mbs, tps = points.setdefault(r.gpu, (set(), set()))
                mbs.update({plan.pipelines[k].microbatch_size} if k < len(plan.pipelines) else all_sizes)
                tps.add(r.tp)
                layers.update(stage.layers)
                memory = memory or r.tp in p.meta.get("estimated_memory_tps", ())
            else:
                if p.meta.get("optimizer") == ESTIMATED:
                    optimizer.add(r.gpu)
                if "converted_from" in p.meta:
                    converted.add((r.gpu, p.meta["converted_from"], p.meta["converted_from_runtime"]))
    return Provenance(model_ref or sim.model.name, sim.precision, tuple(sorted(points)), _ranges(layers),
                      len(layers) == sim.model.num_layers, memory, tuple(sorted(optimizer)),
                      tuple((g, tuple(sorted(m)), tuple(sorted(t))) for g, (m, t) in sorted(points.items())),
                      tuple(sorted(converted)))


def commands(provenances: list[Provenance]) -> list[str]:
    """`sailor profile model` runs that measure everything the plans estimate (one per GPU type)."""
    want: dict[tuple[str, str, str], tuple[set[int], set[int]]] = {}
    for p in provenances:
        for gpu, mbs, tps in p.points:
            m, t = want.setdefault((p.model, p.precision, gpu), (set(), set()))
            m.update(mbs)
            t.update(tps)
        for gpu in p.optimizer:
            want.setdefault((p.model, p.precision, gpu), (set(), set()))
    out = []
    for (model, precision, gpu), (mbs, tps) in sorted(want.items()):
        sizes = f" --micro-batch-sizes {','.join(map(str, sorted(mbs)))}" if mbs else ""
        tp = f" --tp {','.join(map(str, sorted(tps)))}" if tps else ""
        out.append(f"sailor profile model --model {model} --gpu {gpu}{sizes}{tp} --precision {precision} "
                   f"-o profiles   (on a {gpu} machine; then plan with --profiles profiles)")
    return out


def conversion_note(provenances: list[Provenance | None]) -> str | None:
    """One line under a table of plans: which measured profiles were converted, and from what."""
    converted = sorted({c for p in provenances if p is not None for c in p.converted})
    if not converted:
        return None
    target = " or ".join(sorted({p.precision for p in provenances if p is not None and p.converted}))
    return ("converted: measured profiles of " + ", ".join(f"{g} ({prec}, {rt})" for g, prec, rt in converted)
            + f" scaled to {target} on this runtime by the estimator's ratios (docs/simulator.md); "
            "profiles of your own (`sailor profile model`) need none")


def footnotes(provenances: list[Provenance | None]) -> list[str]:
    """Lines for under a table of plans (numbered from 1): what is estimated where, and the commands."""
    many = len(provenances) > 1
    marked = [(i, p) for i, p in enumerate(provenances, 1) if p is not None and (p.time or p.memory)]
    if not marked:
        return []
    lines = []
    gpus = sorted({g for _, p in marked for g in p.gpus})
    if gpus:
        model = marked[0][1].model
        where = "; ".join(f"plan {i}: {', '.join(p.gpus)}, {p.layer_text()}" if many else p.layer_text()
                          for i, p in marked if p.gpus)
        lines.append(f"estimated: no measured profile of {model} on {', '.join(gpus)} ({where})")
    optimizer = sorted({g for _, p in marked for g in p.optimizer})
    if optimizer:
        lines.append(f"estimated: the optimizer step on {', '.join(optimizer)} (its profile has none)")
    if any(p.memory for _, p in marked):
        lines.append("estimated: memory facts (no measured profile of the model has them)")
    return lines + [f"measure: {c}" for c in commands([p for _, p in marked])]
