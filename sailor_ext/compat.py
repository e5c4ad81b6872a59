"""The small shims megatron-core 0.16.1 needs to run outside its own setup.

We never call `parallel_state.initialize_model_parallel`: it builds Megatron's
homogeneous TP/PP/DP grid, which cannot express a plan. Every megatron module
gets its process groups explicitly (tp_group=..., pg_collection=...). Two
pieces of global state that megatron's layers still reach for are installed
here instead, each for a stated reason:

  * the global memory buffer: DotProductAttention takes its QK^T scratch
    tensor from `parallel_state.get_global_memory_buffer()`, which only
    `initialize_model_parallel` creates, and which allocates on
    `torch.cuda.current_device()` (fails on a CPU-only torch). We install a
    buffer that allocates on the run's device.
  * the RNG tracker: attention dropout runs under
    `tensor_parallel.get_cuda_rng_tracker().fork()`, whose states are CUDA
    generator states. On CPU we install a tracker with the same interface that
    forks torch's CPU generator; on CUDA megatron's own tracker is seeded the
    way `model_parallel_cuda_manual_seed` does it (per TP rank).

Context parallelism is not used: `NO_CONTEXT_PARALLEL` stands in for
megatron's CP group where its rotary embedding asks for one (a group of one
rank, which the unfused path never calls).

One more CUDA-ism is avoided rather than patched: without an explicit mask,
megatron's torch softmax builds its causal mask with device="cuda", so the
model always passes one (see model.causal_mask).
"""
from __future__ import annotations

import contextlib
import os
import warnings

# Megatron's TP layers overlap their gradient all-reduce with compute only when
# CUDA runs one hardware queue (and warn on every layer otherwise); set before
# any CUDA context exists, as Megatron-LM's launch scripts do.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")

import torch

# megatron-core warns at import about missing Apex/Transformer Engine; the
# local fallbacks are what we use on CPU, so the warnings are noise here.
warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|TransformerEngine).*")
warnings.filterwarnings("ignore", message=".*apex.*", category=UserWarning)
warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*|.*full scope is deprecated.*")

from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel import random as megatron_random  # noqa: E402
from megatron.core.utils import GlobalMemoryBuffer  # noqa: E402

MODEL_PARALLEL_RNG = megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME


class _NoContextParallel:
    """A context-parallel group of one rank (megatron asks for its size and rank)."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


NO_CONTEXT_PARALLEL = _NoContextParallel()


class DeviceMemoryBuffer(GlobalMemoryBuffer):
    """megatron's scratch-buffer pool, allocating on a given device."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        numel = 1
        for d in tensor_shape:
            numel *= d
        buf = self.buffer.get((name, dtype))
        if buf is None or buf.numel() < numel:
            buf = self.buffer[(name, dtype)] = torch.empty(numel, dtype=dtype, device=self.device)
        return buf[:numel].view(*tensor_shape)


class CPURNGTracker(megatron_random.CudaRNGStatesTracker):
    """megatron's RNG tracker interface over torch's CPU generator."""

    def add(self, name, seed):
        if name in self.states_:
            raise RuntimeError(f"RNG state {name} already exists")
        generator = torch.Generator().manual_seed(seed)
        self.states_[name] = generator.get_state()

    def get_states(self):
        return {k: v.clone() for k, v in self.states_.items()}

    def set_states(self, states):
        self.states_ = {k: v.clone() for k, v in states.items()}

    @contextlib.contextmanager
    def fork(self, name=MODEL_PARALLEL_RNG):
        if name not in self.states_:
            raise RuntimeError(f"RNG state {name} is not added")
        outside = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outside)


def install(device: torch.device, seed: int, tp_rank: int) -> None:
    """Install megatron's global scratch buffer and RNG tracker for this rank.

    Idempotent per process: a second call replaces both (tests build several
    models in one process).
    """
    parallel_state._GLOBAL_MEMORY_BUFFER = DeviceMemoryBuffer(device)
    seed_rng_tracker(device, seed, tp_rank)


def seed_rng_tracker(device: torch.device, seed: int, tp_rank: int) -> None:
    """(Re)start megatron's model-parallel RNG stream for this TP rank."""
    # The same offset megatron's model_parallel_cuda_manual_seed uses, so a
    # TP rank's dropout stream differs from its peers'.
    tp_seed = seed + 2718 + tp_rank
    if device.type == "cuda":
        megatron_random.initialize_rng_tracker(force_reset=True)
        megatron_random.get_cuda_rng_tracker().add(MODEL_PARALLEL_RNG, tp_seed)
    else:
        megatron_random._CUDA_RNG_STATE_TRACKER = CPURNGTracker()
        megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
        megatron_random._CUDA_RNG_STATE_TRACKER.add(MODEL_PARALLEL_RNG, tp_seed)


def pick_device(local_rank: int) -> torch.device:
    """CUDA device `local_rank` where GPUs exist (NCCL), else the CPU (gloo)."""
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")
