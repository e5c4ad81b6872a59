"""AdamW (or SGD) on fp32 main (master) weights, clipped by the global gradient norm.

The optimizer steps the fp32 main parameters of precision.MainParams (the
model's own parameters in fp32 runs, fp32 copies of the bf16/fp16 ones
otherwise) with their fp32 gradients; its state is fp32 too. The caller
rounds the result into a low-precision model (MainParams.copy_to_model).

The global gradient norm covers all shards of all stages and counts each
unique element once: every chunk (sharding.py) has one designated owner,
which alone adds its squares. The caller all-reduces that local sum over the
world (together with the step's loss, one collective) and passes the norm as
a device tensor: the clip coefficient is computed on the device, so a step
never waits for the device to tell the host the norm.
As in Megatron, biases and norms get no weight decay (decays).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sailor_ext.sharding import ParamShard, chunks_of
from sailor_ext.topology import Topology


def decays(name: str, param: torch.Tensor) -> bool:
    """Whether a parameter takes weight decay: matrices do; biases (gpt-oss's experts' are stacked
    [E, ...]), vectors (norms, sinks) and norm weights kept per head ([heads, head_dim]: Command R+'s, StableLM 2
    12B's q/k norms) do not."""
    return param.dim() > 1 and not name.endswith((".bias", "norm.weight"))


@dataclass(frozen=True)
class OptimizerConfig:
    kind: str = "adam"  # adam (AdamW) | sgd (Megatron's --optimizer choices)
    lr: float = 1e-3
    min_lr: float = 0.0
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    sgd_momentum: float = 0.9
    clip_grad: float = 1.0  # 0 disables clipping
    warmup_iters: int = 0
    decay_iters: int = 0  # 0: no decay after warm-up
    decay_style: str = "constant"  # constant | linear | cosine

    def lr_at(self, step: int) -> float:
        """Learning rate of (0-based) step `step`, Megatron's schedule shapes."""
        if self.warmup_iters and step < self.warmup_iters:
            return self.lr * (step + 1) / self.warmup_iters
        if self.decay_style == "constant" or not self.decay_iters:
            return self.lr
        progress = min(1.0, (step - self.warmup_iters) / max(1, self.decay_iters - self.warmup_iters))
        if self.decay_style == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + (self.lr - self.min_lr) * factor


class Optimizer:
    def __init__(self, params: dict[str, torch.Tensor], shards: dict[str, ParamShard], topology: Topology,
                 config: OptimizerConfig):
        """params: the fp32 main parameters by the model's parameter names."""
        self.config, self.shards = config, shards
        self.params = dict(params)
        me = topology.rank
        # the chunks whose squares this rank adds to the global norm
        self._norm_views = [(self.params[ch.param_name], ch) for ch in chunks_of(shards, topology)
                            if ch.designated == me and self._counts(ch.param_name)]
        self.step_count = 0
        self._build(self._stepped())

    def _counts(self, name: str) -> bool:
        """Whether this rank steps (and so counts in the norm) its designated chunks of `name` whole."""
        return True

    def _stepped(self) -> list[tuple[torch.Tensor, bool]]:
        """(tensor, takes weight decay) for every tensor this rank's optimizer steps."""
        return [(p, decays(name, p)) for name, p in self.params.items()]

    def _build(self, stepped: list[tuple[torch.Tensor, bool]]) -> None:
        config = self.config
        self.stepped = [t for t, _ in stepped]
        groups = [{"params": [t for t, decay in stepped if decay], "weight_decay": config.weight_decay},
                  {"params": [t for t, decay in stepped if not decay], "weight_decay": 0.0}]
        if config.kind == "sgd":
            self.inner = torch.optim.SGD(groups, lr=config.lr, momentum=config.sgd_momentum, foreach=True)
            self.state_keys: tuple[str, ...] = ("momentum_buffer",) if config.sgd_momentum else ()
        else:
            self.inner = torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2),
                                           eps=config.eps, foreach=True)
            self.state_keys = ("exp_avg", "exp_avg_sq")

    def stepped_numel(self) -> int:
        """Elements this rank steps: its optimizer state holds len(state_keys) fp32 numbers per element."""
        return sum(t.numel() for t in self.stepped)

    def grads(self) -> list[torch.Tensor]:
        """The (synced) gradients this rank's optimizer reads."""
        return [t.grad for t in self.stepped if t.grad is not None]

    def _norm_grads(self) -> list[torch.Tensor]:
        return [chunk.shard.chunk_view(param.grad, chunk.chunk) for param, chunk in self._norm_views
                if param.grad is not None]

    @torch.no_grad()
    def local_grad_sumsq(self) -> torch.Tensor:
        """Sum of squares of the gradient elements this rank counts (float64)."""
        grads = self._norm_grads()
        device = next(iter(self.params.values())).device
        if not grads:
            return torch.zeros((), dtype=torch.float64, device=device)
        norms = torch.stack(torch._foreach_norm(grads)).double()
        return norms.pow(2).sum()

    @torch.no_grad()
    def unscale(self, scale: float) -> None:
        """Divide every gradient by the fp16 loss scale (a power of two: exact)."""
        torch._foreach_mul_(self.grads(), 1.0 / scale)

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return self.config.lr_at(self.step_count)

    @torch.no_grad()
    def step(self, grad_norm: torch.Tensor) -> float:
        """Clip to the global norm (a float64 device tensor), take one optimizer step; returns the LR used."""
        clip = self.config.clip_grad
        grads = self.grads()
        if clip > 0 and grads:
            # coefficient = clip / (norm + 1e-6) where norm > clip, else 1: multiplying by exactly 1 changes
            # nothing, so this equals a host-side `if` bit for bit (fp32 gradients x the fp32-rounded coefficient)
            coeff = torch.where(grad_norm > clip, clip / (grad_norm + 1e-6), torch.ones_like(grad_norm))
            torch._foreach_mul_(grads, coeff.float())
        lr = self.config.lr_at(self.step_count)
        for group in self.inner.param_groups:
            group["lr"] = lr
        self.inner.step()
        self.step_count += 1
        self._after_step()
        return lr

    def _after_step(self) -> None:
        """What must follow each step (the distributed optimizer gathers the weights)."""

    def params_restored(self) -> None:
        """The main parameters were overwritten (a checkpoint, a reshard, Hugging Face weights)."""

    # -- state by local parameter name (checkpoint.py keys it by logical name) --
    def copy_state_into(self, buffers: dict[str, dict[str, torch.Tensor]]) -> None:
        """Copy every local parameter's state (state_keys) into buffers[name][key], tensors of the
        parameter's local logical shape (snapshot.py's host buffers). Collective in subclasses."""
        for name, held in buffers.items():
            for key, value in self.state_of(name).items():
                held[key].copy_(self.shards[name].view(value))

    def state_of(self, name: str) -> dict[str, torch.Tensor]:
        """The per-element state tensors (state_keys) of a local parameter."""
        param = self.params[name]
        state = self.inner.state.get(param, {})
        return {k: state[k] if state.get(k) is not None else torch.zeros_like(param) for k in self.state_keys}

    def set_state(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        param = self.params[name]
        state = {k: v.to(param.device, param.dtype).reshape(param.shape).clone() for k, v in tensors.items()}
        if isinstance(self.inner, torch.optim.AdamW):
            state["step"] = torch.tensor(float(self.step_count))
        self.inner.state[param] = state
