"""One rank's training state and its step: data -> 1F1B -> sync -> clip -> update.

`Trainer` wires the runtime's pieces together for one rank of a plan. It is
separate from the command line (train.py) so that benchmarks and tests can
drive single steps.

Test hooks: SAILOR_TEST_GRAD_OVERFLOW=STEP[:RANK] puts an inf into one
gradient of rank RANK (default 0) at step STEP (1-based), as an fp16
overflow would (tests/runtime/test_precision.py); SAILOR_TEST_PROGRESS_S
sets VALIDATION_PROGRESS_S (tests/runtime/test_data.py).
"""
from __future__ import annotations

import datetime
import functools
import math
import os
import sys
import time
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from planner.errors import SailorError
from planner.launch import Layout
from planner.outputs import append_record
from planner.specs.families import multimodal_note, unapplied_dropout
from planner.specs.model import BLOCK, ModelSpec
from planner.specs.plan import Plan
from sailor_ext import checkpoint, compat, devices
from sailor_ext.data import BatchSlicer, DataSources, Source, evaluation, microbatches, open_training_data
from sailor_ext.distributed_optimizer import DistributedOptimizer
from sailor_ext.grad_sync import GradSync
from sailor_ext.model import KernelFusion, StageModel, StageSpec, init_from_seed
from sailor_ext.moe import updated_score_bias
from sailor_ext.optimizer import Optimizer, OptimizerConfig
from sailor_ext.p2p import StageLinks
from sailor_ext.precision import LossScaler, MainParams, precision_config
from sailor_ext.schedule import OneFOneB, PipelineShape
from sailor_ext.sharding import chunks_of
from sailor_ext.snapshot import Persister, PersistTarget, SnapshotRing, StoreBoard
from sailor_ext.topology import Topology

# Random streams are a function of (seed, step, TP rank) and nothing else, so
# a checkpoint's "RNG state" is its step and the run's seed, valid under any plan.
RNG_RULE = "derived from (seed, step, tp rank) at every step"


def init_distributed(layout: Layout, rank: int, local_rank: int, timeout_s: float,
                     store: dist.Store | None = None, backend: str | None = None) -> torch.device:
    """Join the world: NCCL on CUDA, gloo on CPU (devices.backend_for); every collective times out.
    store: the rendezvous store startup used (default: MASTER_ADDR/MASTER_PORT)."""
    device = compat.pick_device(local_rank)
    backend = devices.backend_for(device, backend)
    if backend == "gloo" and device.type == "cuda" and layout.plan.pp > 1:
        error = SailorError(f"gloo cannot send CUDA tensors between pipeline stages, and this plan has "
                            f"{layout.plan.pp}; use nccl (one rank per GPU) or a one-stage plan")
        error.agreed = True  # every rank finds the same: rank 0 alone says it
        raise error
    devices.configure(device)
    dist.init_process_group(backend, rank=rank, world_size=layout.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if backend == "nccl" else None,
                            **({"store": dist.PrefixStore("pg", store)} if store is not None else {}))
    return device


def pad_vocab(model: ModelSpec, max_tp: int, divisor: int) -> int:
    """Megatron's padding, for the plan's largest TP degree, so every replica
    holds slices of the same logical embedding."""
    step = divisor * max_tp
    return -(-model.vocab // step) * step


def agreed(action, rank: int, group) -> None:
    """Run `action` on every rank; if it fails with a user mistake on any rank, every rank
    raises that rank's error (a stage that finished would otherwise wait for its peers until
    --dist-timeout). The error is marked `agreed`: rank 0 alone reports it."""
    error = None
    try:
        action()
    except SailorError as e:
        error = f"rank {rank}: {e}"
    errors: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        failure = SailorError(first)
        failure.agreed = True
        raise failure


@dataclass(frozen=True)
class StepResult:
    """One step's outcome. Its loss, gradient norm, stop flag and time live on the device until one
    of them is first read (one host synchronisation for all four): a loop that reads them only where
    it logs never waits for the device between its log points."""

    step: int
    lr: float
    # [global gradient sum of squares, loss, stop requests, sums of MoE sequence balances and token z values,
    # (with score bias updates) the largest expert load over the mean of its block]: float64, on the device
    stats: torch.Tensor
    started: float  # time.perf_counter() when the step began
    skipped: bool = False  # fp16: a gradient overflowed; the weights and the optimizer did not move
    loss_scale: float | None = None  # fp16: the scale this step's loss was multiplied by
    # with router losses: how many sequence balances (blocks x sequences) and token z values (blocks x tokens)
    # the sums count; 0 where that loss is off
    balances: int = 0
    z_values: int = 0

    @functools.cached_property
    def _host(self) -> tuple:
        sumsq, loss, stop, balance, z, *load = self.stats.tolist()
        return sumsq, loss, stop > 0, time.perf_counter() - self.started, balance, z, load[0] if load else None

    @property
    def expert_load_max(self) -> float | None:
        """With score bias updates: over the MoE blocks, the largest of an expert's tokens over the mean of
        its block's experts (1 when even); else None."""
        return self._host[6]

    @property
    def load_balance(self) -> float | None:
        """The mean over MoE blocks and sequences of E / (s k) * sum_e n_e P_e (sailor_ext/moe.py): 1 when
        routing is even, up to E when every token goes to the same experts; None without the loss."""
        return self._host[4] / self.balances if self.balances else None

    @property
    def router_z(self) -> float | None:
        """The mean over MoE blocks and tokens of logsumexp(router logits)^2; None without the z-loss."""
        return self._host[5] / self.z_values if self.z_values else None

    @property
    def loss(self) -> float:
        return self._host[1]

    @property
    def grad_norm(self) -> float | None:
        """None when the step was skipped (fp16 overflow)."""
        return None if self.skipped else math.sqrt(self._host[0])

    @property
    def stop(self) -> bool:
        """Some rank asked to stop after this step (every rank sees the same)."""
        return self._host[2]

    @property
    def seconds(self) -> float:
        """From the step's start until its numbers reached the host: read it right after the step."""
        return self._host[3]

    def record(self) -> dict:
        """The step's fields of a metrics line."""
        out = {"step": self.step, "loss": self.loss, "step_time_s": self.seconds, "grad_norm": self.grad_norm,
               "lr": self.lr}
        if self.loss_scale is not None:
            out.update(loss_scale=self.loss_scale, skipped=self.skipped)
        if self.balances:
            out["load_balance"] = self.load_balance
        if self.z_values:
            out["router_z"] = self.router_z
        if self.expert_load_max is not None:
            out["expert_load_max"] = self.expert_load_max
        return out

    def line(self) -> str:
        """What rank 0 prints."""
        if self.skipped:
            return f"loss {self.loss:.6f} | skipped: a gradient overflowed at loss scale {self.loss_scale:g}"
        scale = f" | loss scale {self.loss_scale:g}" if self.loss_scale is not None else ""
        balance = f" | load balance {self.load_balance:.4f}" if self.balances else ""
        z = f" | router z {self.router_z:.4g}" if self.z_values else ""
        load = f" | expert load max/mean {self.expert_load_max:.3f}" if self.expert_load_max is not None else ""
        return f"loss {self.loss:.6f} | grad norm {self.grad_norm:.4f} | lr {self.lr:.3g}{scale}{balance}{z}{load}"


class MetricsWriter:
    """One JSON line per step (rank 0 only)."""

    def __init__(self, path: str | None, enabled: bool):
        self.path, self.file = path, None
        if path and enabled:
            try:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                self.file = open(path, "a")
            except OSError as e:
                raise SailorError(f"cannot write --metrics-file {path} ({e.strerror}); give a file this rank can "
                                  "write") from None

    def write(self, record: dict) -> None:
        if self.file:
            append_record(self.file, record, f"--metrics-file {self.path}",
                          "free space or give another file, then resume with --load")


VALIDATION_PROGRESS_S = 10.0  # a validation that takes longer prints a progress line this often


def log(line: str) -> None:
    print(f"sailor: {line}", file=sys.stderr, flush=True)


class Trainer:
    def __init__(self, args, plan: Plan, model_spec: ModelSpec, layout: Layout, rank: int, device: torch.device,
                 snapshots: SnapshotRing | None = None, persister: Persister | None = None,
                 padded_vocab: int | None = None, data: DataSources | None = None):
        """After init_distributed; args are train.py's parsed arguments.

        snapshots: the process's in-memory checkpoints (they outlive a Trainer
        in an elastic job); persister: writes them to disk (default: to
        --save, committing through the process group's store); padded_vocab:
        fixed by an elastic job for all its plans (default: padded for this
        plan's largest TP degree); data: training and validation samples
        (default: opened from args)."""
        self.args, self.plan, self.model_spec, self.rank = args, plan, model_spec, rank
        timeout = datetime.timedelta(seconds=args.dist_timeout)
        self.topology = topology = Topology(layout, rank, device, model_spec.tied_embeddings, timeout)
        if not topology.in_plan:
            raise ValueError(f"rank {rank} is not in the plan: a donor builds only a Topology")
        compat.install(device, args.seed, topology.tp_rank)
        stage = plan.stages[topology.stage]
        embedding_stages = topology.tied_stages() if model_spec.tied_embeddings else (0,)
        self.spec = StageSpec(
            model=model_spec, first=stage.first, last=stage.last, tp=topology.tp, tp_rank=topology.tp_rank,
            padded_vocab=padded_vocab or pad_vocab(model_spec, topology.max_tp, args.make_vocab_size_divisible_by),
            embedding_stages=embedding_stages, stage=topology.stage,
            stage_chunks=topology.stage_tp(topology.stage),
            embedding_chunks=max(topology.stage_tp(s) for s in embedding_stages), recompute=stage.recompute,
            moe_aux_loss_coeff=args.moe_aux_loss_coeff, moe_z_loss_coeff=args.moe_z_loss_coeff,
            moe_count_loads=bool(args.moe_router_bias_update_rate))
        fusion = KernelFusion.default(device, swiglu=args.swiglu_fusion, rope=args.rope_fusion)
        self.model = StageModel(self.spec, topology.tp_group, device, fusion)
        self.fused = fusion.applied(model_spec)
        # this stage's MoE blocks (0-based) -> their rows among the model's sparse blocks (expert loads)
        self.sparse_rows = {layer - 1: layer - 1 - sum(d < layer - 1 for d in model_spec.dense_blocks)
                            for layer in self.spec.layers if model_spec.kind(layer) == BLOCK and model_spec.experts
                            and not model_spec.dense(layer - 1)}
        init_from_seed(self.model, args.seed)

        # bf16/fp16: the model is cast, fp32 main parameters and gradients stay (precision.py)
        self.precision = precision_config(args, device.type == "cuda")
        self.main = MainParams(self.model, self.precision.dtype)
        self.params = self.main.params
        self.scaler = LossScaler(self.precision) if self.precision.scaled else None
        self.pipeline = plan.pipelines[topology.replica]
        shape = PipelineShape(self.pipeline.microbatch_size, self.pipeline.num_microbatches, model_spec.seq_len,
                              model_spec.hidden, plan.global_batch_size * model_spec.seq_len)
        self.schedule = OneFOneB(self.model, StageLinks(topology, self.precision.dtype), topology, shape)
        sharded = getattr(args, "use_distributed_optimizer", False)
        if sharded and device.type == "cuda" and dist.get_backend() == "gloo":
            error = SailorError("--use-distributed-optimizer needs nccl on CUDA (gloo cannot all-gather CUDA "
                                "tensors); drop the flag or --distributed-backend gloo")
            error.agreed = True
            raise error
        self.grad_sync = GradSync(self.params, self.model.shards, topology, args.grad_bucket_numel,
                                  self.pipeline.num_microbatches, self.main.model_params, args.overlap_grad_reduce,
                                  sharded)
        config = OptimizerConfig(
            kind=args.optimizer, sgd_momentum=args.sgd_momentum, lr=args.lr, min_lr=args.min_lr,
            weight_decay=args.weight_decay, beta1=args.adam_beta1, beta2=args.adam_beta2, eps=args.adam_eps,
            clip_grad=args.clip_grad, warmup_iters=args.lr_warmup_iters, decay_iters=args.lr_decay_iters,
            decay_style=args.lr_decay_style)
        self.optimizer = DistributedOptimizer(self.params, self.model.shards, topology, config, self.grad_sync) \
            if sharded else Optimizer(self.params, self.model.shards, topology, config)
        self.evaluation = evaluation(args)
        self.data = data or open_training_data(args, model_spec)
        self.source = self.data.train
        self.slicer = BatchSlicer(plan)
        self.step, self.consumed = 0, 0
        self.snapshots = snapshots if snapshots is not None else SnapshotRing()
        self.designated = tuple((ch.param_name, ch.chunk) for ch in chunks_of(self.model.shards, topology)
                                if ch.designated == rank)
        self.persister = persister
        if persister is None and args.save:
            self.persister = Persister(
                PersistTarget(args.save, rank, layout.world_size, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                              args.keep_checkpoints, args.dist_timeout),
                StoreBoard(dist.distributed_c10d._get_default_store(), "sailor/ckpt/"), self.checkpoint_meta(),
                log if rank == 0 else (lambda line: None))
        load_hf = getattr(args, "load_hf", None)
        if args.load and not (load_hf and checkpoint.claimed(args.load) is None):
            self.load(args.load)  # resuming wins over --load-hf: the same command line restarts a run
        elif load_hf:
            agreed(lambda: self.load_hf(load_hf), rank, topology.world_group)
        self.metrics = MetricsWriter(args.metrics_file, rank == 0)
        self.save_failure: str | None = None  # the first failed checkpoint of this rank (run)
        self._overflow_at = _overflow_hook(rank)

    @property
    def device(self) -> torch.device:
        return self.topology.device

    def microbatches(self, source: Source | None = None, consumed: int | None = None) -> list[torch.Tensor | None]:
        """This pipeline's microbatches of the next step (default) or of the batch of `source` after
        `consumed` samples (first and last stage only)."""
        topo = self.topology
        if not (topo.is_first_stage or topo.is_last_stage):
            return [None] * self.pipeline.num_microbatches
        consumed = self.consumed if consumed is None else consumed
        return [self._to_device(torch.from_numpy(np.asarray(mb)))
                for mb in microbatches(source or self.source, self.slicer, consumed, topo.replica)]

    def _to_device(self, tokens: torch.Tensor) -> torch.Tensor:
        """On CUDA through pinned memory: a copy from pageable memory would wait for the GPU's queue to drain."""
        if self.device.type == "cuda":
            return tokens.pin_memory().to(self.device, non_blocking=True)
        return tokens.to(self.device)

    def seed_step(self) -> None:
        """Random streams of the next step (see RNG_RULE)."""
        seed = zlib.crc32(f"{self.args.seed}/{self.step}/{self.topology.tp_rank}".encode())
        torch.manual_seed(seed)
        compat.seed_rng_tracker(self.device, seed, self.topology.tp_rank)

    def train_step(self, stop: bool = False) -> StepResult:
        """One step; `stop` (this rank's wish to stop after it) is agreed in the
        step's own all-reduce, so every rank stops after the same step."""
        start = time.perf_counter()
        topo = self.topology
        self.seed_step()
        scale = self.scaler.scale if self.scaler is not None else 1.0
        self.schedule.loss_scale = scale
        loss_sum = self.schedule.run(self.microbatches())  # with overlap, buckets start during its backward
        self.grad_sync.finish()
        if self._overflow_at == self.step + 1:
            self._inject_overflow()
        if scale != 1.0:
            self.optimizer.unscale(scale)
        counts_loss = topo.is_last_stage and topo.tp_rank == 0  # one copy of each pipeline's loss
        router = self.model.take_router_sums()  # [2]
        counted = self._expert_loads() if self.args.moe_router_bias_update_rate and self.model_spec.sparse_blocks \
            else []
        stats = torch.cat([torch.stack([self.optimizer.local_grad_sumsq(),
                                        (loss_sum if counts_loss else torch.zeros_like(loss_sum)).double(),
                                        torch.full((), float(stop), dtype=torch.float64, device=loss_sum.device)]),
                           router if topo.tp_rank == 0 else torch.zeros_like(router), *counted])  # no host copy
        # grad norm, loss, stop requests, router sums, expert loads: one collective
        dist.all_reduce(stats, group=topo.world_group)
        loads = None
        if counted:  # the global batch's tokens per expert [sparse blocks, E]; the step reports the worst balance
            loads = stats[5:].view(self.model_spec.sparse_blocks, self.model_spec.experts)
            stats = torch.cat([stats[:5], (loads.amax(dim=1) / loads.mean(dim=1)).amax().view(1)])
        skipped = False
        if self.scaler is not None:
            # fp16 only: skipping is the host's decision, so it reads the norm (as Megatron reads found_inf).
            # Every gradient element is counted by one rank, so the world's sum of squares is finite
            # exactly when no gradient overflowed anywhere: every rank takes the same decision.
            skipped = not math.isfinite(float(stats[0]))
            self.scaler.update(skipped)
        if skipped:  # as Megatron: the iteration counts, the optimizer (and its LR schedule) does not move
            lr = self.optimizer.lr
        else:
            if loads is not None:
                self._update_score_biases(loads)
            lr = self.optimizer.step(stats[0].sqrt())
            self.main.copy_to_model()
        self.grad_sync.zero_grad()
        self.step += 1
        self.consumed += self.plan.global_batch_size
        blocks, batch = self.model_spec.sparse_blocks, self.plan.global_batch_size
        return StepResult(self.step, lr, stats, start, skipped, scale if self.scaler is not None else None,
                          blocks * batch if self.args.moe_aux_loss_coeff else 0,
                          blocks * batch * self.model_spec.seq_len if self.args.moe_z_loss_coeff else 0)

    def _expert_loads(self) -> list[torch.Tensor]:
        """This step's tokens per expert of this stage's MoE blocks, for the step's all-reduce: [the model's
        sparse blocks x E] float64, this stage's rows filled by TP rank 0 of each replica (its TP ranks route
        alike) and zero elsewhere, so the sum over the world counts the global batch once."""
        spec = self.model_spec
        rows = torch.zeros(spec.sparse_blocks, spec.experts, dtype=torch.float64, device=self.device)
        for block, load in self.model.take_expert_loads().items():
            if self.topology.tp_rank == 0:
                rows[self.sparse_rows[block]] += load
        return [rows.flatten()]

    def _update_score_biases(self, loads: torch.Tensor) -> None:
        """Move each local MoE block's score biases toward an even load of the global batch (updated_score_bias)
        in the main parameters, before the step: every rank holding a copy moves it alike, and the optimizer
        leaves it (no gradient reaches it)."""
        with torch.no_grad():
            for block, row in self.sparse_rows.items():
                main = self.main.params[f"layers.{block + 1}.mlp.router.score_bias"]
                main.copy_(updated_score_bias(main, loads[row], self.args.moe_router_bias_update_rate))

    def _inject_overflow(self) -> None:
        """The test hook: an inf in this rank's first gradient (after the sync), as an fp16 overflow leaves it."""
        grad = next(g for g in self.optimizer.grads() if g.numel())
        grad.view(-1)[0] = float("inf")

    def evaluate(self) -> float:
        """Mean loss of the first --eval-iters global batches of the validation data, forward only.
        A long one says how far it is on rank 0, at most every VALIDATION_PROGRESS_S."""
        topo = self.topology
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        iters, every = self.evaluation.iters, float(os.environ.get("SAILOR_TEST_PROGRESS_S", VALIDATION_PROGRESS_S))
        start = shown = time.monotonic()
        for k in range(iters):
            loss_sum = self.schedule.forward_only(self.microbatches(self.data.validation,
                                                                    k * self.plan.global_batch_size))
            if topo.is_last_stage and topo.tp_rank == 0:  # one copy of each pipeline's loss
                total += loss_sum.double()
            if self.rank == 0 and k + 1 < iters and time.monotonic() - shown >= every:
                shown = time.monotonic()
                log(f"validation after step {self.step}: {k + 1}/{iters} batches ({shown - start:.0f} s)")
        dist.all_reduce(total, group=topo.world_group)
        return float(total) / self.evaluation.iters

    def validate(self, step: int) -> float | None:
        """The validation loss after `step` where --eval-interval asks for one (printed by rank 0)."""
        if not self.evaluation.due(step, self.args.train_iters):
            return None
        loss = self.evaluate()
        if self.rank == 0:
            print(f"step {step}/{self.args.train_iters} | validation loss {loss:.6f}", flush=True)
        return loss

    # -- checkpoints -----------------------------------------------------------------
    def checkpoint_meta(self) -> dict:
        return {"model": self.model_spec.name, "seq_len": self.model_spec.seq_len,
                "model_config": self.model_spec.to_dict(), "hf_source": getattr(self.args, "load_hf", None),
                "padded_vocab": self.spec.padded_vocab, "seed": self.args.seed, "rng": RNG_RULE,
                "plan_global_batch_size": self.plan.global_batch_size, "precision": self.precision.name,
                "weights": "fp32 main parameters"}

    def load_hf(self, directory: str) -> None:
        """Start from a Hugging Face checkpoint: this rank's slices of its weights, a fresh optimizer."""
        from sailor_ext import hf

        hf.load_stage(self.model, directory, self.params)
        self.optimizer.params_restored()
        self.main.copy_to_model()
        if self.rank == 0:
            log(f"loaded Hugging Face weights from {directory}")

    def snapshot(self):
        """Copy this rank's state into host memory (the blocking part of a checkpoint)."""
        return self.snapshots.take(self.params, self.optimizer, self.model.shards, self.designated, self.step,
                                   self.consumed, self.scaler.state_dict() if self.scaler is not None else None)

    def save(self) -> float:
        """Checkpoint: snapshot now, write to disk in the background. Returns the
        seconds the step was blocked."""
        start = time.perf_counter()
        snap = self.snapshot()
        if self.persister is not None:
            self.persister.submit(snap)
        return time.perf_counter() - start

    def choose_checkpoint(self, load_dir: str, known_bad: tuple = ()) -> checkpoint.Choice:
        """The newest checkpoint in `load_dir` whose meta.json and `latest` verify, skipping
        `known_bad` (collective: rank 0 reads the few kilobytes and tells the others)."""
        choice = [None]
        if self.rank == 0:
            try:
                choice = [checkpoint.choose(load_dir, known_bad)]
            except SailorError as e:  # every rank must leave the broadcast
                choice = [e]
            except Exception as e:  # the storage's own: no credentials, no network, a bucket that is not there
                first = (str(e).strip().splitlines() or [""])[0][:200]
                choice = [SailorError(f"cannot read checkpoints at --load {load_dir} ({type(e).__name__}: {first}); "
                                      "check the path, the storage's credentials and the network")]
        dist.broadcast_object_list(choice, src=0, group=self.topology.world_group)
        if isinstance(choice[0], SailorError):
            choice[0].agreed = True  # rank 0 alone reports it
        if isinstance(choice[0], Exception):
            raise choice[0]
        return choice[0]

    def load(self, load_dir: str, choice: checkpoint.Choice | None = None) -> None:
        """Resume from the newest checkpoint that verifies (default choice: choose_checkpoint).

        Collective. Each rank checks the SHA-256 of every block it reads, and
        nothing else; if any rank finds one damaged, every rank falls back to the
        next older checkpoint. Rank 0 says in one line what it skipped."""
        bad: list[tuple[str, str]] = []
        while True:
            choice = choice or self.choose_checkpoint(load_dir, tuple(bad))
            problem = None
            try:
                meta = checkpoint.load_into(checkpoint.open_choice(choice), self.params, self.optimizer,
                                            self.model.shards)
            except checkpoint.Damaged as e:
                problem = str(e)
            problems: list = [None] * dist.get_world_size(self.topology.world_group)
            dist.all_gather_object(problems, problem, group=self.topology.world_group)
            found = next((p for p in problems if p), None)
            if found is None:
                break
            bad.append((choice.name, found))
            choice = None
        if self.rank == 0:
            for note in choice.notes():
                log(note)
        self.resume_at(meta["step"], meta["consumed_samples"], meta.get("loss_scaler"))

    def resume_at(self, step: int, consumed: int, loss_scaler: dict | None = None) -> None:
        """After the main parameters were restored (disk or memory): the model, the position, the scale."""
        self.optimizer.params_restored()
        self.main.copy_to_model()
        self.step, self.consumed = step, consumed
        if self.scaler is not None:
            self.scaler.load_state_dict(loss_scaler)

    def peak_memory(self) -> dict:
        """GPU memory (bytes): this rank's peak allocated and reserved by torch's allocator so far, and what the
        device has in use now (every process on it, the CUDA context and libraries' buffers included: what
        the simulator budgets as the GPU's runtime overhead). Nothing on the CPU, where torch keeps no count."""
        if self.device.type != "cuda":
            return {}
        free, total = torch.cuda.mem_get_info(self.device)
        return {"peak_memory_bytes": torch.cuda.max_memory_allocated(self.device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(self.device), "device_used_bytes": total - free}

    def run(self) -> None:
        args, plan, layout = self.args, self.plan, self.topology.layout
        if self.rank == 0:
            print(f"sailor: training {self.model_spec.name} on {layout.world_size} ranks ({plan.pp} stages x "
                  f"{plan.dp} replicas), global batch {plan.global_batch_size}, {self.precision.name} "
                  f"on {self.device.type} ({dist.get_backend()}), {self.grad_sync.num_collectives} gradient buckets "
                  f"on rank 0{' overlapped with the backward pass' if self.grad_sync.overlap else ''}"
                  f"{', compiled ' + ' and '.join(self.fused) + ' kernels' if self.fused else ''}", flush=True)
            if self.grad_sync.sharded:
                print(f"sailor: distributed optimizer: rank 0 steps {self.optimizer.stepped_numel()} of its "
                      f"{sum(p.numel() for p in self.params.values())} parameters", flush=True)
            note = multimodal_note(plan.model)
            if note:
                log(f"note: {note}")
            dropout = unapplied_dropout(plan.model)
            if dropout:
                log(f"note: the model's config.json sets {', '.join(f'{k} {v:g}' for k, v in dropout.items())}; "
                    "sailor trains without dropout")
        samples = [p.samples for p in plan.pipelines]
        tokens = plan.global_batch_size * self.model_spec.seq_len
        # SAILOR_CUDA_SYNC_DEBUG=1: any host synchronisation inside a step after the first raises (torch's sync
        # debug mode); log points, checkpoints and validation, outside the step, may synchronise
        check_syncs = os.environ.get("SAILOR_CUDA_SYNC_DEBUG", "") not in ("", "0") and self.device.type == "cuda"
        if self.step >= args.train_iters and self.rank == 0:  # resumed at or past the end: say so, not nothing
            log(f"the checkpoint resumed is at step {self.step}, which reaches --train-iters {args.train_iters}: "
                "nothing to train; raise --train-iters to train further")
        while self.step < args.train_iters:
            if check_syncs and self.step > 0:
                torch.cuda.set_sync_debug_mode("error")
            r = self.train_step()
            if check_syncs:
                torch.cuda.set_sync_debug_mode("default")
            printed = self.rank == 0 and args.log_interval and r.step % args.log_interval == 0
            record = None  # a log point reads the step's numbers (elsewhere they stay on the device)
            if self.metrics.file or printed:
                record = {**r.record(), "tokens": tokens, "samples_per_replica": samples,
                          **self.peak_memory()}
            if printed:
                print(f"step {r.step}/{args.train_iters} | {r.line()} | {r.seconds:.3f} s", flush=True)
            at_interval = args.save_interval and r.step % args.save_interval == 0
            if args.save and (at_interval or r.step == args.train_iters):
                blocked = self.save()
                if record is not None:
                    record["save_blocked_s"] = blocked
            if (val_loss := self.validate(r.step)) is not None and record is not None:
                record["val_loss"] = val_loss
            if record is not None:
                self.metrics.write(record)
        if self.rank == 0 and self.grad_sync.overlap:
            log(f"the last step started {self.grad_sync.started_in_backward} of {self.grad_sync.num_collectives} "
                "gradient buckets on rank 0 during the backward pass")
        if self.persister is not None:
            self.persister.flush()
            self.persister.close()
            self.save_failure = self.persister.failure


def _overflow_hook(rank: int) -> int | None:
    """The step at which SAILOR_TEST_GRAD_OVERFLOW=STEP[:RANK] makes this rank's gradient overflow."""
    spec = os.environ.get("SAILOR_TEST_GRAD_OVERFLOW")
    if not spec:
        return None
    step, _, where = spec.partition(":")
    return int(step) if int(where or 0) == rank else None
