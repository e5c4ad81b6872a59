"""Iteration time, memory and cost of a plan.

Time, per pipeline k (replica k of every stage; microbatch size b, m microbatches):

    F_s, B_s  forward/backward seconds of stage s for one microbatch (profile, GPU and TP of replica k)
    c_s       seconds to move one microbatch's activation (and, back, its gradient)
              across the boundary s -> s+1 (network.p2p_time)
    slot_s    = F_s + B_s + 2 c_{s-1} + 2 c_s       a stage's busy time per microbatch in the
                                                    1F1B steady state; p2p blocks both ends
    T_pp      = sum_s (F_s + B_s) + 2 sum_s c_s     first microbatch in and last one out...
              + (m - 1) * max_s slot_s              ...and the bottleneck stage in between
                                                    (equal to an event simulation of DeepSpeed's
                                                    1F1B instruction stream within 0.4 % on the
                                                    measured plans)

Then every stage syncs its gradients across its D replicas and steps its
optimizer:

    T_iter = max_k T_pp,k + max_s allreduce_s + max_{s,k} update_s,k

allreduce_s is the ring all-reduce of the stage's fp32 gradients over its
replicas' links (network.allreduce_time); update_s,k = optimizer seconds per
parameter (profile) * the stage's parameters / tp, / D_s with the distributed optimizer (each
replica steps its 1/D_s part; its reduce-scatter and all-gather move the all-reduce's bytes,
so allreduce_s is unchanged). A stage that recomputes
activations has its blocks' backward and memory changed by recompute.py.

The sync is counted from the slowest pipeline's last backward on. A stage's ring
can start earlier: once the stage's own last backward is done (DeepSpeed; this
changes the predictions on the measured runs by less than 0.1 %), and in our
runtime (--overlap-grad-reduce) bucket by bucket during that backward. Either
way it hides at most one microbatch's backward through stages s, s-1, ..., 0
(the stage's last backward and the drain after it), which is not counted.

Cost per iteration:

    compute = T_iter * sum over GPUs of price [USD/h] / 3600
    egress  = sum of bytes that cross zones per iteration * USD/GB of that route
              (activations and gradients between stages in different zones;
               every ring edge of a gradient all-reduce carries 2(D-1)/D * G bytes)

Memory per GPU: see memory.py.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from planner.errors import SailorError
from planner.profiles.store import ProfileStore
from planner.simulator.memory import inflight_microbatches, memory_parts, replica_memory
from planner.simulator.network import Endpoint, Network, ring_edges
from planner.simulator.placement import place
from planner.simulator.recompute import recomputed_memory, recomputed_times
from planner.simulator.runtime_model import RuntimeModel, runtime_model
from planner.specs.hardware import Cluster
from planner.specs.model import BLOCK, ModelSpec, canonical_name
from planner.specs.plan import Plan
from planner.specs.precision import check_precision

GRAD_BYTES = 4  # gradients are all-reduced in fp32


@dataclass(frozen=True)
class StageEstimate:
    """The simulator's prediction for one stage (its slowest and largest replica)."""

    index: int
    layers: tuple[int, int]
    gpus: dict[str, int]  # "TYPE@ZONE" -> GPUs
    tp: list[int]  # TP degree of each replica
    compute_s: float  # forward+backward of one microbatch, slowest replica
    sync_s: float  # gradient all-reduce across replicas
    memory_bytes: float  # peak of one GPU, worst replica
    capacity_bytes: int  # memory of that replica's GPU
    fits: bool
    memory_parts: dict[str, float] = field(default_factory=dict)  # the worst replica's terms (memory.py)
    recompute: bool = False  # the stage recomputes its blocks' activations in backward


@dataclass(frozen=True)
class Estimate:
    """The simulator's prediction for a plan: iteration time, memory, cost, and per stage."""

    iteration_time_s: float
    pipeline_time_s: float  # slowest pipeline's 1F1B schedule
    sync_time_s: float  # what gradient sync and optimizer add after the pipelines
    throughput_iters_per_s: float
    tokens_per_s: float
    peak_memory_bytes: float
    memory_per_stage_bytes: list[float]
    fits_in_memory: bool
    cost_per_iteration_usd: float
    compute_cost_per_iteration_usd: float
    egress_cost_per_iteration_usd: float
    cost_per_hour_usd: float
    cost_per_million_tokens_usd: float
    gpus_used: dict[str, int]
    stages: list[StageEstimate]
    sources: dict[str, str] = field(default_factory=dict)  # what was measured, what estimated

    def to_dict(self) -> dict:
        return asdict(self)


class Simulator:
    """Simulates plans of one model on one cluster with one set of profiles."""

    def __init__(self, model: ModelSpec, cluster: Cluster, profiles: ProfileStore, precision: str = "fp32"):
        self.model = model
        self.cluster = cluster
        self.profiles = profiles
        self.precision = check_precision(precision)
        self.network = Network(cluster, profiles.network)
        self._profile_cache: dict = {}
        self._recomputed: dict = {}
        self.blocks = tuple(model.kind(layer) == BLOCK for layer in range(model.num_layers))

    def profile(self, gpu: str):
        if gpu not in self._profile_cache:
            self._profile_cache[gpu] = self.profiles.get(self.model, self.cluster.gpu(gpu), self.precision)
        return self._profile_cache[gpu]

    def layer_times(self, gpu: str, mbs: int, tp: int, recompute: bool = False):
        times = self.profile(gpu).layer_times(mbs, tp)
        if not recompute:
            return times
        key = ("times", gpu, mbs, tp)
        if key not in self._recomputed:
            self._recomputed[key] = recomputed_times(times, self.blocks)
        return self._recomputed[key]

    def layer_memory(self, gpu: str, tp: int, recompute: bool = False):
        mem = self.profile(gpu).layer_memory(tp)
        if not recompute:
            return mem
        key = ("memory", gpu, tp)
        if key not in self._recomputed:
            self._recomputed[key] = recomputed_memory(mem, self.blocks)
        return self._recomputed[key]

    # -- the three models --------------------------------------------------
    def simulate(self, plan: Plan, runtime: RuntimeModel | None = None) -> Estimate:
        plan.check(self.model.num_layers, self.cluster)
        if plan.precision not in (None, self.precision):
            raise SailorError(f"the plan trains in {plan.precision} but this simulator models {self.precision}; "
                              f"simulate it with --precision {plan.precision} (or leave --precision out)")
        types = {r.gpu for st in plan.stages for r in st.replicas}
        check_precision(self.precision, [self.cluster.gpu(g) for g in types], "plan")
        rt = runtime or runtime_model(plan.runtime)
        P, D = plan.pp, plan.dp
        nodes = place(plan, self.cluster)
        compute = [[0.0] * D for _ in range(P)]
        pipeline_time = 0.0
        egress = 0.0
        done: dict = {}  # identical pipelines (same replicas, links and batch share) are simulated once
        both_ways: dict = {}  # (zone, zone) -> USD per GB there and back
        for k, pipe in enumerate(plan.pipelines):
            b, m = pipe.microbatch_size, pipe.num_microbatches
            reps = [st.replicas[k] for st in plan.stages]
            key = (tuple(reps), b, m, tuple(nodes[s][k] == nodes[s + 1][k] for s in range(P - 1)))
            if key not in done:
                done[key] = self._pipeline(plan, k, reps, nodes, b, m, rt)
            comp_k, t_pp, wire = done[key]
            pipeline_time = max(pipeline_time, t_pp)
            for s in range(P):
                compute[s][k] = comp_k[s]
            for s, nbytes in enumerate(wire):  # activations forward, gradients back
                a, c = reps[s].zone, reps[s + 1].zone
                if a != c:
                    usd_per_gb = both_ways.get((a, c))
                    if usd_per_gb is None:
                        usd_per_gb = both_ways[(a, c)] = self.cluster.egress_per_gb(a, c) + self.cluster.egress_per_gb(c, a)
                    egress += m * nbytes * usd_per_gb / 1e9
        stages, sync_max, update_max, peak, fits = [], 0.0, 0.0, 0.0, True
        for s, st in enumerate(plan.stages):
            sync, sync_egress = self._sync(st, nodes[s])
            egress += sync_egress
            params = self.profile(st.replicas[0].gpu).layer_memory(1).stage_params(st.first, st.last)
            shards = self.optimizer_shards(plan, s, rt)  # each replica steps its part of the stage
            update = max(self.profile(r.gpu).optimizer_s_per_param * params / r.tp for r in st.replicas) / shards
            sync_max, update_max = max(sync_max, sync), max(update_max, update)
            mem, cap, ok, parts = self._stage_memory(plan, s, rt)
            peak, fits = max(peak, mem), fits and ok
            used = Counter()
            for r in st.replicas:
                used[f"{r.gpu}@{r.zone}"] += r.tp
            stages.append(StageEstimate(s, (st.first, st.last), dict(used), [r.tp for r in st.replicas],
                                        max(compute[s]), sync, mem, cap, ok, parts, st.recompute))
        finish = pipeline_time + sync_max + update_max
        gpus_used = Counter()
        usd_per_s = 0.0
        for (gpu, zone), n in plan.gpus_used().items():
            gpus_used[f"{gpu}@{zone}"] += n
            usd_per_s += n * self.cluster.price_per_hour(gpu, zone, self.cluster.is_spot(gpu, zone)) / 3600
        compute_usd = finish * usd_per_s
        total_usd = compute_usd + egress
        tokens = plan.global_batch_size * self.model.seq_len
        return Estimate(
            iteration_time_s=finish, pipeline_time_s=pipeline_time, sync_time_s=finish - pipeline_time,
            throughput_iters_per_s=1.0 / finish, tokens_per_s=tokens / finish, peak_memory_bytes=peak,
            memory_per_stage_bytes=[st.memory_bytes for st in stages], fits_in_memory=fits,
            cost_per_iteration_usd=total_usd, compute_cost_per_iteration_usd=compute_usd,
            egress_cost_per_iteration_usd=egress, cost_per_hour_usd=total_usd * 3600 / finish,
            cost_per_million_tokens_usd=total_usd / tokens * 1e6, gpus_used=dict(gpus_used), stages=stages,
            sources=self._sources(plan),
        )

    def _pipeline(self, plan: Plan, k: int, reps, nodes, b: int, m: int, rt: RuntimeModel):
        """1F1B of pipeline k: F+B per stage, pipeline time, bytes sent per boundary and microbatch."""
        P = plan.pp
        F, B, c, wire = [], [], [], []
        for s, st in enumerate(plan.stages):
            f, bw = self.layer_times(reps[s].gpu, b, reps[s].tp, st.recompute).stage(st.first, st.last)
            F.append(f)
            B.append(bw)
        for s in range(P - 1):
            src, dst = reps[s], reps[s + 1]
            x = b * self.profile(src.gpu).layer_memory(1).output_bytes[plan.stages[s].last]
            links = (src.tp, dst.tp) if rt.p2p_split_over_tp else (1, 1)
            a = Endpoint(src.gpu, src.zone, nodes[s][k], links[0])
            z = Endpoint(dst.gpu, dst.zone, nodes[s + 1][k], links[1])
            c.append(self.network.p2p_time(x, a, z))
            wire.append(x)
        slot = max(F[s] + B[s] + 2 * (c[s - 1] if s else 0.0) + 2 * (c[s] if s < P - 1 else 0.0) for s in range(P))
        t_pp = sum(F) + sum(B) + 2 * sum(c) + (m - 1) * slot
        return [F[s] + B[s] for s in range(P)], t_pp, wire

    def _sync(self, st, stage_nodes: list[int]) -> tuple[float, float]:
        """Seconds to all-reduce the stage's gradients over its replicas' ring, and its egress USD."""
        if len(st.replicas) < 2:
            return 0.0, 0.0
        params = self.profile(st.replicas[0].gpu).layer_memory(1).stage_params(st.first, st.last)
        return self.edges_sync(params, len(st.replicas), ring_edges(st.replicas, stage_nodes))

    def edges_sync(self, params: int, members: int, edges) -> tuple[float, float]:
        """Seconds to all-reduce the gradients of `params` parameters over a ring of `members` replicas
        given by its distinct edges (network.ring_edges), and its egress USD."""
        grads = GRAD_BYTES * params
        per_edge = 2 * (members - 1) / members * grads
        egress = sum(n * per_edge * self.cluster.egress_per_gb(a.zone, b.zone) / 1e9
                     for a, b, n in edges if a.zone != b.zone)
        return self.network.allreduce_time(grads, members, edges), egress

    def pipeline_times(self, plan: Plan, runtime: RuntimeModel | None = None) -> list[float]:
        """T_pp of every pipeline [s]: when each replica set finishes its last backward."""
        rt = runtime or runtime_model(plan.runtime)
        nodes = place(plan, self.cluster)
        return [self._pipeline(plan, k, [st.replicas[k] for st in plan.stages], nodes, pipe.microbatch_size,
                               pipe.num_microbatches, rt)[1] for k, pipe in enumerate(plan.pipelines)]

    def pipeline_costs(self, plan: Plan, runtime: RuntimeModel | None = None):
        """(F, B, c, k) of the slowest pipeline k: seconds per stage and boundary, for timelines."""
        rt = runtime or runtime_model(plan.runtime)
        nodes = place(plan, self.cluster)
        worst = None
        for k, pipe in enumerate(plan.pipelines):
            reps = [st.replicas[k] for st in plan.stages]
            _, t_pp, _ = self._pipeline(plan, k, reps, nodes, pipe.microbatch_size, pipe.num_microbatches, rt)
            if worst is None or t_pp > worst[0]:
                worst = (t_pp, k)
        k = worst[1]
        reps = [st.replicas[k] for st in plan.stages]
        b = plan.pipelines[k].microbatch_size
        F, B, c = [], [], []
        for s, st in enumerate(plan.stages):
            f, bw = self.layer_times(reps[s].gpu, b, reps[s].tp, st.recompute).stage(st.first, st.last)
            F.append(f)
            B.append(bw)
            if s + 1 < plan.pp:
                x = b * self.profile(reps[s].gpu).layer_memory(1).output_bytes[st.last]
                links = (reps[s].tp, reps[s + 1].tp) if rt.p2p_split_over_tp else (1, 1)
                c.append(self.network.p2p_time(x, Endpoint(reps[s].gpu, reps[s].zone, nodes[s][k], links[0]),
                                               Endpoint(reps[s + 1].gpu, reps[s + 1].zone, nodes[s + 1][k], links[1])))
        return F, B, c, k

    def stage_fits(self, plan: Plan, s: int, runtime: RuntimeModel | None = None) -> bool:
        """Whether every replica of stage s fits in its GPU's memory."""
        return self._stage_memory(plan, s, runtime or runtime_model(plan.runtime))[2]

    @staticmethod
    def optimizer_shards(plan: Plan, s: int, rt: RuntimeModel) -> int:
        """Ways stage s's optimizer state and step are split: its replicas with the distributed
        optimizer (one owner per replica of each part) on a runtime that has one, else 1."""
        return len(plan.stages[s].replicas) if plan.distributed_optimizer and rt.sharded_state_bytes else 1

    def _stage_memory(self, plan: Plan, s: int, rt: RuntimeModel) -> tuple[float, int, bool, dict]:
        """Worst GPU of the stage: (bytes, capacity of its GPU, every replica fits, its terms)."""
        st = plan.stages[s]
        worst, cap, ok, parts = -1.0, 0, True, {}
        tied_copy = self.model.tied_embeddings and st.last == self.model.num_layers - 1 and st.first > 0
        seen = set()
        shards = self.optimizer_shards(plan, s, rt)
        for k, r in enumerate(st.replicas):
            pipe = plan.pipelines[k]
            inflight = inflight_microbatches(s, plan.pp, pipe.num_microbatches)
            if (r.gpu, r.tp, pipe.microbatch_size, inflight) in seen:
                continue
            seen.add((r.gpu, r.tp, pipe.microbatch_size, inflight))
            gpu = self.cluster.gpu(r.gpu)
            extra = self.profile(r.gpu).layer_memory(r.tp).params[0] if tied_copy else 0
            args = (self.layer_memory(r.gpu, r.tp, st.recompute), st.first, st.last)
            kw = dict(mbs=pipe.microbatch_size, inflight=inflight,
                      state_bytes_per_param=rt.state_bytes(self.precision, shards),
                      allocator_factor=rt.allocator_factor, overhead_bytes=gpu.runtime_overhead_bytes,
                      optimizer_step_bytes=rt.optimizer_step_bytes / shards, extra_params=extra)
            mem = replica_memory(*args, **kw)
            ok = ok and mem <= gpu.memory_bytes
            if mem / gpu.memory_bytes > worst / max(cap, 1):
                worst, cap, parts = mem, gpu.memory_bytes, (args, kw)
        return worst, cap, ok, memory_parts(*parts[0], **parts[1])

    def _sources(self, plan: Plan) -> dict[str, str]:
        out = {}
        for gpu in sorted({r.gpu for st in plan.stages for r in st.replicas}):
            profile = self.profile(gpu)
            same = canonical_name(profile.model) == canonical_name(self.model.name)
            out[f"profile {self.model.name} on {gpu}"] = profile.source if same else \
                f"{profile.source} ({profile.model}'s: the same architecture)"
        fitted = self.profiles.network.sources
        out["network"] = "measured fits where available" if fitted else "estimated from the catalog"
        return out

