"""Per-layer costs of the runtime's own layers, measured on this rank.

`LayerBench` builds the model the way the training runtime does
(`sailor_ext.model.StageModel`: the embedding, blocks of megatron-core's
attention and MLP, the head with the vocabulary-parallel loss), at one TP
degree, and measures for one microbatch size:

  * forward and backward seconds of each layer. Each layer runs on its own
    input ([s, b, h] activations, or tokens for the embedding) and its backward
    gets a fixed output gradient (the head's gets the loss). Every repetition
    runs all layers once, so slow drift of the machine affects all layers
    alike; the median over repetitions is kept, and with TP > 1 the slowest
    TP rank's median (the group moves at its pace). On CUDA each layer costs
    the larger of its host launch and its kernels (profile/timing.py), and the
    blocks are then rescaled to what they take run back to back, forward then
    backward, as a training step runs them: the host launches ahead while the
    GPU works, which a layer timed alone cannot show;
  * activation bytes kept for backward, per sample: the storages autograd
    saves during the layer's forward (torch.autograd.graph.saved_tensors_hooks),
    each counted once, parameters and buffers excluded. This is what 1F1B holds
    per microbatch in flight, on CPU and GPU alike;
  * output bytes per sample (what a stage boundary sends), parameters on this
    rank; on CUDA also the allocator's peak during forward + backward.

Only `blocks` transformer blocks of each kind of work are built (`built_blocks`:
blocks alike in shape, rotary positions, a window under fused attention, a dense
MLP among experts; planner.profiles.estimate.same_work), and every block of the
model gets the median of the measured blocks of its kind (Sailor profiles two
blocks of its uniform models). The optimizer step is the runtime's `Optimizer` (AdamW, global
norm, clipping) over the built layers, reported per parameter. With bf16 or
fp16 the stage is cast as the runtime casts it (precision.MainParams: 16-bit
weights and activations, fp32 main gradients filled by hooks, fp32 masters
stepped and copied back), so the times include what mixed precision costs; an
fp16 step also unscales the gradients and reads their norm on the host, as the
trainer's does (loss scaling).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from planner.profiles.estimate import same_work
from planner.specs.model import BLOCK, EMBEDDING, HEAD, ModelSpec
from sailor_ext import compat
from sailor_ext.loss import vocab_parallel_cross_entropy
from sailor_ext.model import StageModel, StageSpec, init_from_seed
from sailor_ext.optimizer import Optimizer, OptimizerConfig
from sailor_ext.precision import MainParams
from sailor_ext.profile.timing import STATISTICS, Clock, median


@dataclass(frozen=True)
class PointMeasurement:
    """One (microbatch size, TP degree): lists run over the built layers
    (embedding, the measured blocks, head)."""

    mbs: int
    tp: int
    fwd: list[float]  # seconds
    bwd: list[float]
    activation_bytes: list[float]  # per sample
    output_bytes: list[float]  # per sample
    params: list[int]  # on one GPU of the TP group
    peak_bytes: list[float] | None = None  # CUDA allocator peak of forward + backward (per microbatch)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class _SoloTopology:
    """What `Optimizer` asks of a topology, for a rank with no replicas: it is
    the only holder of every chunk, so it counts all of them in the norm."""

    def __init__(self, rank: int):
        self.rank = rank

    def whole_owners(self, stages):
        return (self.rank,)

    def chunk_owners(self, stages, chunk, num_chunks):
        return (self.rank,)


class LayerBench:
    """The embedding, `blocks` transformer blocks and the head of `model` on one TP rank."""

    def __init__(self, model: ModelSpec, blocks: int, tp: int, tp_rank: int, tp_group, device: torch.device,
                 precision: str = "fp32", seed: int = 1234):
        self.model, self.tp, self.tp_group, self.device = model, tp, tp_group, device
        reduced = reduced_model(model, built_blocks(model, blocks))
        spec = StageSpec(reduced, 0, reduced.num_layers - 1, tp, tp_rank, model.padded_vocab(tp),
                         stage=0, stage_chunks=tp, embedding_chunks=tp)
        compat.install(device, seed, tp_rank)
        self.stage = StageModel(spec, tp_group, device)
        init_from_seed(self.stage, seed)
        self.layers = list(self.stage.layers.values())
        self.kinds = [reduced.kind(i) for i in range(reduced.num_layers)]
        self.clock = Clock(device)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
        self.scaled = precision == "fp16"
        self.main = MainParams(self.stage, self.dtype)
        if self.main.low_precision:  # the runtime's fp32 main gradients are persistent buffers
            for p in self.main.params.values():
                p.grad = torch.zeros_like(p)
        self._excluded = {t.untyped_storage().data_ptr() for t in (*self.stage.parameters(), *self.stage.buffers())}
        self._generator = torch.Generator().manual_seed(seed + tp_rank)

    # -- one layer's forward, as the runtime runs it ---------------------------------
    def _inputs(self, mbs: int) -> dict:
        m, s = self.model, self.model.seq_len
        tokens = torch.randint(0, m.vocab, (mbs, s), generator=self._generator).to(self.device)
        # activations arrive in the compute dtype, as StageLinks sends them
        hidden = torch.randn(s, mbs, m.hidden, generator=self._generator).to(self.device, self.dtype)
        return {"tokens": tokens, "hidden": hidden.requires_grad_(), "labels": tokens.t().contiguous(),
                "grad": torch.randn(s, mbs, m.hidden, generator=self._generator).to(self.device, self.dtype)}

    def _forward(self, index: int, inputs: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tensor to call backward on, its gradient or None for a scalar loss)."""
        kind = self.kinds[index]
        if kind == EMBEDDING:
            return self.stage.run_layer(index, inputs["tokens"]), inputs["grad"]
        if kind == HEAD:
            logits = self.stage.run_layer(index, inputs["hidden"])
            token_loss = vocab_parallel_cross_entropy(logits, inputs["labels"], self.stage.vocab_start,
                                                      self.tp_group, self.model.vocab)
            return token_loss.sum() / token_loss.numel(), None
        return self.stage.run_layer(index, inputs["hidden"]), inputs["grad"]

    @staticmethod
    def _backward(out: torch.Tensor, grad: torch.Tensor | None) -> None:
        out.backward(None if grad is None else grad.to(out.dtype))  # as schedule.OneFOneB does

    def _sync(self) -> None:
        """Start TP ranks together: a timed layer should not include waiting for a peer."""
        if self.tp > 1:
            dist.barrier(group=self.tp_group)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- measurements ------------------------------------------------------------------
    def measure(self, mbs: int, warmup: int, repeats: int, statistic: str = "median") -> PointMeasurement:
        inputs = self._inputs(mbs)
        n = len(self.layers)
        fwd: list[list[float]] = [[] for _ in range(n)]
        bwd: list[list[float]] = [[] for _ in range(n)]
        for rep in range(warmup + repeats):
            for i in range(n):
                self._sync()
                (out, grad), tf = self.clock.time(lambda: self._forward(i, inputs))
                self._sync()
                _, tb = self.clock.time(lambda: self._backward(out, grad))
                inputs["hidden"].grad = None
                if rep >= warmup:
                    fwd[i].append(tf)
                    bwd[i].append(tb)
        self.stage.zero_grad(set_to_none=True)
        stat = STATISTICS[statistic]
        fwd_s, bwd_s = [stat(x) for x in fwd], [stat(x) for x in bwd]
        blocks = [i for i, kind in enumerate(self.kinds) if kind == BLOCK]
        if self.clock.cuda and blocks:
            # Layer by layer, a block's host launch and its kernels cannot overlap; in training the host
            # launches the next blocks (and the next microbatch's forward during this one's backward)
            # while the GPU runs, so the blocks cost what they cost back to back: rescale them to that.
            scale = self._blocks_back_to_back(blocks, inputs, warmup, repeats) / sum(fwd_s[i] + bwd_s[i]
                                                                                      for i in blocks)
            for i in blocks:
                fwd_s[i], bwd_s[i] = fwd_s[i] * scale, bwd_s[i] * scale
        medians = torch.tensor(fwd_s + bwd_s, dtype=torch.float64)
        if self.tp > 1:  # the group moves at its slowest rank's pace
            medians = medians.to(self.device)
            dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=self.tp_group)
        medians = medians.cpu().tolist()
        saved, outputs = zip(*(self._saved_and_output_bytes(i, inputs) for i in range(n)))
        return PointMeasurement(
            mbs, self.tp, medians[:n], medians[n:], [b / mbs for b in saved], [b / mbs for b in outputs],
            [sum(p.numel() for p in layer.parameters()) for layer in self.layers],
            self._cuda_peaks(inputs) if self.device.type == "cuda" else None)

    def _blocks_back_to_back(self, blocks: list[int], inputs: dict, warmup: int, repeats: int) -> float:
        """Seconds of one forward and backward through the built blocks, as training runs them: repeated
        with no synchronisation in between (CUDA events around all repetitions, over their count)."""

        def one_microbatch():
            h = inputs["hidden"]
            for i in blocks:
                h = self.stage.run_layer(i, h)
            self._backward(h, inputs["grad"])
            inputs["hidden"].grad = None

        for _ in range(warmup):
            one_microbatch()
        self._sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            one_microbatch()
        end.record()
        end.synchronize()
        self.stage.zero_grad(set_to_none=True)
        return start.elapsed_time(end) / 1e3 / repeats

    def _saved_and_output_bytes(self, index: int, inputs: dict) -> tuple[float, float]:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in self._excluded:
                seen[ptr] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, _ = self._forward(index, inputs)
        if self.kinds[index] == HEAD:
            output = 4.0 * inputs["tokens"].numel()  # the per-token loss: one fp32 per token
        else:
            output = float(out.numel() * out.element_size())
        del out
        return float(sum(seen.values())), output

    def _cuda_peaks(self, inputs: dict) -> list[float]:
        peaks = []
        for i in range(len(self.layers)):
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            out, grad = self._forward(i, inputs)
            self._backward(out, grad)
            del out
            torch.cuda.synchronize(self.device)
            peaks.append(float(torch.cuda.max_memory_allocated(self.device) - base))
            inputs["hidden"].grad = None
        self.stage.zero_grad(set_to_none=True)
        return peaks

    def optimizer_seconds(self, warmup: int, repeats: int, statistic: str = "median") -> tuple[float, int]:
        """Seconds (median or mean) of the runtime's optimizer step over the built layers, and their parameters."""
        for p in self.main.params.values():
            p.grad = torch.randn(p.shape, generator=self._generator).to(p.device, p.dtype) * 1e-3
        opt = Optimizer(self.main.params, self.stage.shards, _SoloTopology(0), OptimizerConfig())

        def step():
            if self.scaled:  # (by 1: the same pass over the gradients, which then do not shrink over the repeats)
                opt.unscale(1.0)
            sumsq = opt.local_grad_sumsq()
            if self.scaled:  # fp16: the host decides whether the step is skipped (trainer.py)
                float(sumsq)
            opt.step(sumsq.sqrt())  # the clip coefficient on the device, as in training
            self.main.copy_to_model()

        times = []
        for rep in range(warmup + repeats):
            self._sync()
            _, t = self.clock.time(step)
            if rep >= warmup:
                times.append(t)
        self.stage.zero_grad(set_to_none=True)
        value = torch.tensor([STATISTICS[statistic](times)], dtype=torch.float64, device=self.device)
        if self.tp > 1:
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.tp_group)
        return float(value.item()), sum(p.numel() for p in self.stage.parameters())

    def busy(self, mbs: int, stop) -> int:
        """Run forward and backward of every layer until `stop()` is true (a load rank
        standing in for a co-located training process); returns the passes run."""
        inputs = self._inputs(mbs)
        passes = 0
        while not stop():
            for i in range(len(self.layers)):
                out, grad = self._forward(i, inputs)
                self._backward(out, grad)
                inputs["hidden"].grad = None
            passes += 1
        self.stage.zero_grad(set_to_none=True)
        return passes


def built_blocks(model: ModelSpec, blocks: int) -> tuple[int, ...]:
    """The blocks (0-based) that a profile builds and times: the first `blocks` of each kind of work (same_work
    under our runtime), in model order."""
    chosen, counts = [], {}
    for block in range(model.num_blocks):
        key = same_work(model, block + 1, "sailor")
        if counts.get(key, 0) < blocks:
            counts[key] = counts.get(key, 0) + 1
            chosen.append(block)
    return tuple(chosen)


def reduced_model(model: ModelSpec, chosen: tuple[int, ...]) -> ModelSpec:
    """`model` with only the blocks `chosen`, each as the model has it (window, rotary positions, dense MLP)."""
    dense = tuple(i for i, b in enumerate(chosen) if model.dense(b))
    linear = tuple(i for i, b in enumerate(chosen) if model.linear(b))
    return replace(model, num_blocks=len(chosen), windows=tuple(model.windows[b] for b in chosen) if model.windows
                   else (), nope_blocks=tuple(i for i, b in enumerate(chosen) if b in model.nope_blocks),
                   dense_blocks=dense, dense_ffn=model.dense_ffn if dense else 0, linear_blocks=linear,
                   **({} if linear else dict(linear_key_heads=0, linear_value_heads=0, linear_key_dim=0,
                                             linear_value_dim=0, linear_conv=0)))


def expand_to_model(values: list, kinds: list[str], model: ModelSpec, blocks: int, combine=median) -> list:
    """Per built layer -> per model layer: every block gets `combine` of the measured blocks of its kind of work
    (built_blocks(model, blocks) were built)."""
    measured: dict[tuple, list] = {}
    for block, value in zip(built_blocks(model, blocks), [v for v, k in zip(values, kinds) if k == BLOCK]):
        measured.setdefault(same_work(model, block + 1, "sailor"), []).append(value)
    combined = {key: combine(v) for key, v in measured.items()}
    out = []
    for layer in range(model.num_layers):
        kind = model.kind(layer)
        if kind == BLOCK:
            out.append(combined[same_work(model, layer, "sailor")])
        elif kind == EMBEDDING:
            out.append(values[kinds.index(EMBEDDING)])
        else:
            out.append(values[kinds.index(kind)])
    return out
