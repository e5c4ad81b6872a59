"""A parallelization plan: stages, their replicas, and how the batch is split.

    stage s      = a contiguous range of model layers [first, last]
    replica k    = one copy of stage s on `tp` GPUs of one type in one zone
                   (its own tensor-parallel degree; replicas of one stage may differ)
    pipeline k   = replica k of every stage, chained: it runs `num_microbatches`
                   microbatches of `microbatch_size` samples through the stages

Every stage has the same number of replicas D (= the number of pipelines), and
replica k of stage s feeds replica k of stage s+1, as in Sailor's plans. The
global batch is sum_k microbatch_size_k * num_microbatches_k, so faster
pipelines can take more samples. Gradients of stage s are synchronized across
its D replicas. A stage may recompute its transformer blocks' activations in
backward (`recompute`): it then keeps only each block's input per microbatch
in flight, at the price of a second forward pass.

A plan also names the model it was made for: a preset by name, any other
model (a config.json's) by its whole description (`model_config`), so the
commands that read the plan later need nothing else; the sequence
length it was made for (`seq_length`); and its training precision
(`precision`: fp32, bf16 or fp16, planner/specs/precision.py), which
`sailor simulate` simulates and `sailor launch` passes to the runtime; and
whether the optimizer state is split over each stage's replicas
(`distributed_optimizer`, sailor's runtime only: --use-distributed-optimizer).
`plan_model` is how every command gets the model of a plan.

File format (JSON); `count` repeats an entry:

    {"format": "sailor-plan", "version": 1, "model": "opt-350m", "seq_length": 2048,
     "global_batch_size": 1024, "runtime": "sailor", "precision": "bf16",
     "stages": [{"layers": [0, 12], "recompute": false,
                 "replicas": [{"gpu": "A100-40", "tp": 2, "zone": "us-central1-a", "count": 32}]},
                ...],
     "pipelines": [{"microbatch_size": 2, "num_microbatches": 16, "count": 32}],
     "model_config": {...}}     # ModelSpec.to_dict(), only for models that are not presets

Sailor's plan_config format (pipeline_list / layers_per_stage / tmp_per_stage /
dp / mbs / gbs) is read and written too; written, it also carries the model,
runtime, sequence length and precision (fields Sailor ignores), so it re-reads
as the same plan. Sailor's own files (no precision field) are fp32: its
measured runs were.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import groupby

from planner.errors import SailorError
from planner.inputs import MAX_BATCH, MAX_COUNT, Doc, parse_json, read_text
from planner.specs.model import ModelSpec, check_seq_length, get_model, is_preset_spec, model_from_dict
from planner.specs.precision import PRECISIONS

RUNTIMES = ("sailor", "megatron-deepspeed")


@dataclass(frozen=True)
class Replica:
    """One copy of a stage: `tp` GPUs of one type in one zone (a TP group, never across nodes)."""

    gpu: str
    tp: int
    zone: str


@dataclass(frozen=True)
class Stage:
    """A pipeline stage: a contiguous range of layers and its data-parallel replicas (one per pipeline)."""

    first: int  # first layer, inclusive
    last: int  # last layer, inclusive
    replicas: tuple[Replica, ...]
    recompute: bool = False  # recompute the blocks' activations in backward (keep only their inputs)

    @property
    def layers(self) -> range:
        return range(self.first, self.last + 1)


@dataclass(frozen=True)
class Pipeline:
    """The data share of replica index k: its microbatch size and count."""

    microbatch_size: int
    num_microbatches: int

    @property
    def samples(self) -> int:
        return self.microbatch_size * self.num_microbatches


@dataclass(frozen=True)
class Plan:
    """A whole parallelization plan: stages (layers, replicas) and pipelines (their microbatches)."""

    model: str
    global_batch_size: int
    stages: tuple[Stage, ...]
    pipelines: tuple[Pipeline, ...]
    runtime: str = "sailor"  # which framework executes it (the simulator models each)
    notes: dict = field(default_factory=dict, compare=False, hash=False)  # extra fields kept from files
    seq_length: int | None = None  # tokens per sample it was made for; None: the model's default (older files)
    model_spec: ModelSpec | None = None  # the whole model, when it is not a preset (`model` names it then)
    precision: str | None = None  # fp32 | bf16 | fp16; None: not recorded (older files), the default rule
    distributed_optimizer: bool = False  # optimizer state split over each stage's replicas (ZeRO-1)

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def dp(self) -> int:
        return len(self.pipelines)

    @property
    def recompute(self) -> bool:
        """True if any stage recomputes activations."""
        return any(s.recompute for s in self.stages)

    @property
    def num_gpus(self) -> int:
        return sum(r.tp for s in self.stages for r in s.replicas)

    def gpus_used(self) -> Counter:
        """GPUs per (type, zone)."""
        used: Counter = Counter()
        for s in self.stages:
            for r in s.replicas:
                used[(r.gpu, r.zone)] += r.tp
        return used

    def check(self, num_layers: int | None = None, cluster=None) -> "Plan":
        """Raise SailorError if the plan is malformed; return it otherwise."""
        if self.runtime not in RUNTIMES:
            raise SailorError(f"plan: unknown runtime {self.runtime!r}; use one of {', '.join(RUNTIMES)}")
        if self.distributed_optimizer and self.runtime != "sailor":
            raise SailorError(f"plan: the distributed optimizer is sailor's runtime's, not {self.runtime}'s; "
                              "drop distributed_optimizer or use runtime sailor")
        if not self.stages:
            raise SailorError("plan has no stages: give at least one stage with a layer range and replicas")
        if not self.pipelines:
            raise SailorError("plan has no pipelines: give the microbatch size and count of each replica")
        expect = 0
        for i, s in enumerate(self.stages):
            if s.first != expect:
                what = "a gap" if s.first > expect else "an overlap"
                raise SailorError(f"plan: stage {i} starts at layer {s.first} but the previous stage ends at "
                                  f"{expect - 1} ({what}); stage layer ranges must be contiguous")
            if s.last < s.first:
                raise SailorError(f"plan: stage {i} has an empty layer range [{s.first}, {s.last}]")
            expect = s.last + 1
            if len(s.replicas) != self.dp:
                raise SailorError(f"plan: stage {i} has {len(s.replicas)} replicas but there are {self.dp} "
                                  "pipelines; every stage needs one replica per pipeline")
            for r in s.replicas:
                if r.tp < 1 or r.tp & (r.tp - 1):
                    raise SailorError(f"plan: stage {i} uses TP degree {r.tp}; use a power of two (1, 2, 4, 8)")
                if cluster is not None:
                    spec = cluster.gpu(r.gpu)
                    if r.tp > spec.gpus_per_node:
                        raise SailorError(f"plan: stage {i} uses TP {r.tp} on {spec.name}, larger than its "
                                          f"{spec.gpus_per_node} GPUs per node; keep TP inside a node")
        if num_layers is not None and expect != num_layers:
            raise SailorError(f"plan: stages cover layers 0..{expect - 1} but the model has {num_layers} "
                              f"layers (0..{num_layers - 1}); the last stage must end at layer {num_layers - 1}")
        for k, p in enumerate(self.pipelines):
            if p.microbatch_size < 1 or p.num_microbatches < 1:
                raise SailorError(f"plan: pipeline {k} needs a positive microbatch size and count")
        total = sum(p.samples for p in self.pipelines)
        if total != self.global_batch_size:
            raise SailorError(f"plan: pipelines process {total} samples per iteration but the global batch is "
                              f"{self.global_batch_size}; make sum(microbatch_size * num_microbatches) match")
        return self


# -- the model of a plan --------------------------------------------------------
def with_model(plan: Plan, model: ModelSpec) -> Plan:
    """`plan`, made for `model`: its name and sequence length, and its whole description unless it is a preset."""
    return replace(plan, model=model.name, seq_length=model.seq_len,
                   model_spec=None if is_preset_spec(model) else model)


def plan_model(plan: Plan, override: str | None = None, seq_len: int | None = None) -> ModelSpec:
    """The model `plan` trains; every command that reads a plan gets it here.

    override: a preset or config.json from the command line, instead of the
    plan's model. seq_len: --seq-length; a plan made for another sequence
    length refuses it (its split, microbatches and memory were chosen for
    its own), plans that do not record one (older files, Sailor's) take it.
    """
    check_seq_length(seq_len)
    if seq_len is not None and plan.seq_length is not None and seq_len != plan.seq_length:
        raise SailorError(f"--seq-length {seq_len} contradicts the plan, which was made for sequence length "
                          f"{plan.seq_length}; drop the flag, or make a plan for it with `sailor plan --seq-length "
                          f"{seq_len}`")
    seq = plan.seq_length or seq_len
    if override:
        model = get_model(override, seq)
        layers = plan.stages[-1].last + 1
        if model.num_layers != layers:  # (the layer ranges would say only that they do not cover it)
            raise SailorError(f"--model {override} has {model.num_layers} layers, and the plan's model {plan.model} "
                              f"{layers}; drop --model, or make a plan for {override}")
        return model
    if plan.model_spec is not None:
        return plan.model_spec
    return get_model(plan.model, seq)


# -- our JSON format ----------------------------------------------------------
def plan_to_dict(plan: Plan) -> dict:
    def runs(items, encode):
        out = []
        for item, group in groupby(items):
            n = len(list(group))
            d = encode(item)
            if n > 1:
                d["count"] = n
            out.append(d)
        return out

    return {
        "format": "sailor-plan",
        "version": 1,
        "model": plan.model,
        **({"seq_length": plan.seq_length} if plan.seq_length is not None else {}),
        "global_batch_size": plan.global_batch_size,
        "runtime": plan.runtime,
        **({"precision": plan.precision} if plan.precision is not None else {}),
        **({"distributed_optimizer": True} if plan.distributed_optimizer else {}),
        "stages": [
            {"layers": [s.first, s.last], **({"recompute": True} if s.recompute else {}),
             "replicas": runs(s.replicas, lambda r: {"gpu": r.gpu, "tp": r.tp, "zone": r.zone})}
            for s in plan.stages
        ],
        "pipelines": runs(plan.pipelines, lambda p: {"microbatch_size": p.microbatch_size,
                                                     "num_microbatches": p.num_microbatches}),
        **({"model_config": plan.model_spec.to_dict()} if plan.model_spec is not None else {}),
        **plan.notes,
    }


PLAN_HINT = "see the plan format in docs/formats.md"
SAILOR_MEASURED = ("real", "max_mem", "red_grads", "N")  # what Sailor measured for its plans; kept as notes
MAX_LAYERS = 1 << 13
MAX_TP = 64


def plan_from_dict(d: dict, source: str = "plan") -> Plan:
    """A plan from our JSON format (or Sailor's, detected by its fields), every field checked."""
    if isinstance(d, dict) and ("pipeline_list" in d or "sailor_plan" in d):
        return plan_from_sailor(d, source)
    top = Doc(d, source).fields(
        required=("model", "global_batch_size", "stages", "pipelines"),
        optional=("format", "version", "seq_length", "runtime", "precision", "distributed_optimizer",
                  "model_config", "notes", *SAILOR_MEASURED),
        hint=PLAN_HINT)
    if "format" in top:
        top["format"].str(("sailor-plan",), hint="this reads plans written by `sailor plan`")
    if "version" in top:
        top["version"].int(1, 1, hint="this sailor reads version 1")
    stages = []
    for st in top["stages"].items(1, MAX_LAYERS, PLAN_HINT):
        f = st.fields(("layers", "replicas"), ("recompute",), PLAN_HINT)
        first, last = (x.int(0, MAX_LAYERS) for x in f["layers"].items(2, 2, "write [first layer, last layer]"))
        replicas = []
        for r in f["replicas"].items(1, MAX_COUNT, PLAN_HINT):
            rf = r.fields(("gpu", "tp", "zone"), ("count",), PLAN_HINT)
            count = rf["count"].int(1, MAX_COUNT) if "count" in rf else 1
            if len(replicas) + count > MAX_COUNT:
                r.fail(f"at most {MAX_COUNT} replicas in all")
            replicas += [Replica(rf["gpu"].str(), rf["tp"].int(1, MAX_TP), rf["zone"].str())] * count
        stages.append(Stage(first, last, tuple(replicas), f["recompute"].bool() if "recompute" in f else False))
    pipelines = []
    for pipe in top["pipelines"].items(1, MAX_COUNT, PLAN_HINT):
        pf = pipe.fields(("microbatch_size", "num_microbatches"), ("count",), PLAN_HINT)
        count = pf["count"].int(1, MAX_COUNT) if "count" in pf else 1
        if len(pipelines) + count > MAX_COUNT:
            pipe.fail(f"at most {MAX_COUNT} pipelines in all")
        pipelines += [Pipeline(pf["microbatch_size"].int(1, MAX_BATCH), pf["num_microbatches"].int(1, MAX_BATCH))] \
            * count
    seq_length = top["seq_length"].int(1, 1 << 24) if "seq_length" in top else None
    notes = {k: v.value for k, v in top.items() if k in ("notes", *SAILOR_MEASURED)}
    plan = Plan(top["model"].str(), top["global_batch_size"].int(1, MAX_BATCH), tuple(stages), tuple(pipelines),
                top["runtime"].str(RUNTIMES) if "runtime" in top else "sailor", notes, seq_length,
                precision=top["precision"].str(PRECISIONS) if "precision" in top else None,
                distributed_optimizer=top["distributed_optimizer"].bool() if "distributed_optimizer" in top else False)
    if "model_config" not in top:
        return plan
    spec = model_from_dict(d["model_config"], f"{source}: model_config")
    if spec.name != plan.model:
        raise SailorError(f"{source}: model {plan.model!r} but model_config describes {spec.name!r}; make them agree")
    if plan.seq_length not in (None, spec.seq_len):
        raise SailorError(f"{source}: seq_length {plan.seq_length} but model_config has seq_len {spec.seq_len}; "
                          "make them agree")
    return replace(plan, seq_length=spec.seq_len, model_spec=spec)


# -- Sailor's plan_config format ---------------------------------------------
def plan_from_sailor(d: dict, source: str = "plan", model: str | None = None) -> Plan:
    """Read Sailor's plan (as in sailor-data/validation and anchor-plans).

    Sailor plans use one microbatch size for every replica and split the batch
    uniformly: each of the D pipelines runs gbs / (mbs * D) microbatches. They
    ran on Megatron-DeepSpeed, so the plan's runtime is that. Sailor's files
    carry more than this reads (estimates, the case), so other fields are let be.
    """
    hint = "see Sailor's plan_config format in docs/formats.md"
    top = Doc(d, source).fields(open_ended=True, hint=hint)
    if "sailor_plan" in top:
        case = top["case"].fields(open_ended=True) if "case" in top else {}
        inner = dict(top["sailor_plan"].fields(open_ended=True))
        gbs = inner.get("gbs") or case.get("global_batch_size")
        name = model or (case["model"].str() if "model" in case else None)
        return _sailor_plan(inner, gbs, source, name, hint)
    return _sailor_plan(top, top.get("gbs"), source, model, hint)


def _sailor_plan(top: dict, gbs_doc, source: str, model: str | None, hint: str) -> Plan:
    from planner.specs.hardware import canonical_gpu  # GH-96 -> GH200-96
    from planner.specs.model import canonical_name

    if "pipeline_list" not in top:
        raise SailorError(f"{source}: missing field 'pipeline_list'; {hint}")
    if gbs_doc is None:
        raise SailorError(f"{source}: missing field 'gbs' (the global batch size); {hint}")
    if "mbs" not in top:
        raise SailorError(f"{source}: missing field 'mbs' (the microbatch size); {hint}")
    lists = top["pipeline_list"].items(1, hint=hint)
    if len(lists) != 1:
        raise SailorError(f"{source}: Sailor plans with {len(lists)} pipeline templates are not supported; "
                          "use one template")
    p = lists[0].fields(("layers_per_stage", "tmp_per_stage", "dp"), open_ended=True, hint=hint)
    mbs, gbs = top["mbs"].int(1, MAX_BATCH), gbs_doc.int(1, MAX_BATCH)
    layers = p["layers_per_stage"].items(1, MAX_LAYERS, hint)
    reps = p["tmp_per_stage"].items(len(layers), len(layers), f"one entry per stage ({len(layers)}); {hint}")
    dp = [x.int(1, MAX_COUNT) for x in p["dp"].items(len(layers), len(layers), f"one count per stage; {hint}")]
    if len(set(dp)) != 1:
        raise SailorError(f"{source}: stages have different replica counts {dp}; every stage needs the same")
    stages = []
    for layer_doc, rep_doc, count in zip(layers, reps, dp):
        ids = layer_doc.ints(lo=0)
        if not ids or list(ids) != list(range(ids[0], ids[0] + len(ids))):
            layer_doc.fail("a non-empty list of consecutive layer indices", hint)
        replicas = []
        for rep in rep_doc.items(count, count, f"{count} replicas, as dp says; {hint}"):
            placed, outer = rep.items(2, 2, "write [[[GPU, TP, ZONE]], TP]")
            gpu, tp, zone = placed.items(1, 1, "write [[GPU, TP, ZONE]]")[0].items(3, 3, "write [GPU, TP, ZONE]")
            tp_value = tp.int(1, MAX_TP)
            if outer.int(1, MAX_TP) != tp_value:  # the replica's TP degree, written twice
                outer.fail(f"the replica's TP degree, {tp_value} as in [GPU, TP, ZONE]", hint)
            replicas.append(Replica(canonical_gpu(gpu.str()) or gpu.str(), tp_value, zone.str()))
        stages.append(Stage(ids[0], ids[-1], tuple(replicas)))
    if gbs % mbs:
        raise SailorError(f"{source}: global batch {gbs} is not a multiple of the microbatch size {mbs}")
    # gbs/mbs microbatches over D pipelines; where they don't divide, the
    # first pipelines take one more (Sailor rounds every pipeline up).
    D = dp[0]
    n, extra = divmod(gbs // mbs, D)
    if n < 1:
        raise SailorError(f"{source}: {gbs // mbs} microbatches cannot feed {D} pipelines; each needs at least one")
    pipelines = tuple(Pipeline(mbs, n + (k < extra)) for k in range(D))
    measured = {k: top[k].value for k in SAILOR_MEASURED if k in top}
    name = canonical_name(model or (top["model"].str() if "model" in top else "opt-350m"))
    # Sailor's own files ran on Megatron-DeepSpeed; ours say which runtime and model they were made for
    runtime = top["runtime"].str(RUNTIMES) if "runtime" in top else "megatron-deepspeed"
    seq_length = top["seq_length"].int(1, 1 << 24) if "seq_length" in top else None
    precision = top["precision"].str(PRECISIONS) if "precision" in top else "fp32"  # Sailor's runs were fp32
    sharded = top["distributed_optimizer"].bool() if "distributed_optimizer" in top else False
    plan = Plan(name, gbs, tuple(stages), pipelines, runtime, measured, seq_length, precision=precision,
                distributed_optimizer=sharded)
    if "model_config" in top:
        spec = model_from_dict(top["model_config"].value, f"{source}: model_config")
        plan = replace(plan, model=spec.name, seq_length=spec.seq_len, model_spec=spec)
    return plan


def plan_to_sailor(plan: Plan) -> dict:
    """Write Sailor's plan_config format (one microbatch size, uniform split)."""
    shares = set(plan.pipelines)
    if len(shares) != 1:
        raise SailorError("this plan gives replicas different microbatch sizes or counts, which Sailor's format "
                          "cannot express; save it in sailor's own format instead")
    if plan.recompute:
        raise SailorError("this plan recomputes activations, which Sailor's format cannot express; save it in "
                          "sailor's own format instead")
    from planner.specs.hardware import SAILOR_GPU_NAMES

    mbs = plan.pipelines[0].microbatch_size
    # Sailor reads only its own fields; the others make `sailor simulate` of this file see the same plan
    return {
        "model": plan.model, "runtime": plan.runtime,
        **({"seq_length": plan.seq_length} if plan.seq_length is not None else {}),
        **({"precision": plan.precision} if plan.precision is not None else {}),
        **({"distributed_optimizer": True} if plan.distributed_optimizer else {}),
        **({"model_config": plan.model_spec.to_dict()} if plan.model_spec is not None else {}),
        "pipeline_list": [{
            "num_stages": plan.pp,
            "layers_per_stage": [list(s.layers) for s in plan.stages],
            "tmp_per_stage": [[[[[SAILOR_GPU_NAMES.get(r.gpu, r.gpu), r.tp, r.zone]], r.tp] for r in s.replicas]
                              for s in plan.stages],
            "dp": [len(s.replicas) for s in plan.stages],
        }],
        "mbs": mbs,
        "gbs": plan.global_batch_size,
    }


def load_plan(path: str) -> Plan:
    """Read a plan file in our format or Sailor's (detected from its fields)."""
    where = f"plan file {path}"
    return plan_from_dict(parse_json(read_text(path, "plan file"), where), where)


def plan_text(plan: Plan, fmt: str = "sailor-plan") -> str:
    """The file's text: our format or Sailor's."""
    return json.dumps(plan_to_sailor(plan) if fmt == "sailor" else plan_to_dict(plan), indent=1) + "\n"


def save_plan(plan: Plan, path: str, fmt: str = "sailor-plan") -> None:
    """Write atomically: a failed write leaves the previous plan."""
    from planner.outputs import write_output

    write_output(path, plan_text(plan, fmt), what="plan file")


def check_plan_for(plan: Plan, model: ModelSpec, cluster, source: str) -> None:
    """A plan read from a file, against what it will run on: its layers, GPU types, zones and TP degrees."""
    from planner.launch import check_tp

    plan.check(model.num_layers, cluster)
    for i, stage in enumerate(plan.stages):
        for r in {(r.gpu, r.zone, r.tp): r for r in stage.replicas}.values():
            cluster.check_zone(r.zone, f"{source}: stage {i}")
            check_tp(model, r.tp, f"{source}: stage {i}")
