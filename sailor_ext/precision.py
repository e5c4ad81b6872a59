"""Mixed precision as Megatron does it: low-precision model, fp32 main gradients and master weights.

With --bf16 or --fp16 the stage model's parameters are bf16/fp16, so every
activation is too: the embedding output, each block's output, what crosses a
stage boundary. The residual stream therefore has one dtype on every stage,
and where a plan cuts the model does not change the numbers (an autocast
region would keep fp32 residuals on some stages and bf16 ones on others).
Two things stay fp32, as in Megatron's Float16OptimizerWithFloat16Params (and the routers of the
mixtures of experts whose ModelSpec says router_fp32, as transformers keeps them):

  * main gradients: after each microbatch's backward, a hook adds the
    parameter's low-precision gradient into an fp32 `.grad` of its main
    parameter and frees the low-precision one, so gradients accumulate over
    microbatches in fp32 (grad_sync.py all-reduces these fp32 buffers);
  * main (master) parameters and the optimizer state: the optimizer steps
    fp32 copies, which are then rounded into the model (`copy_to_model`).
    Checkpoints, snapshots, the elastic reshard and `sailor export` all read
    and write the fp32 main parameters, so a run resumes exactly under any
    plan and nothing is lost to bf16 rounding between steps.

In fp32 the main parameters are the model's own parameters (no copies, no
hooks), so the fp32 path is what it was before mixed precision existed.

fp16's 5-bit exponent underflows small gradients (below 6e-8), so fp16
training scales the loss by S before backward (gradients scale by S too),
unscales the fp32 main gradients by 1/S, and skips any step whose
gradients overflowed (`LossScaler`, Megatron's DynamicGradScaler rules).
bf16 has fp32's exponent range and needs no scaling.

Memory per parameter with Adam: 2 (bf16 weight) + 4 (fp32 main gradient) +
4 (fp32 master) + 8 (two fp32 moments) = 18 bytes, the simulator's figure
(planner/simulator/runtime_model.py); fp32 training needs 16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.errors import SailorError

if TYPE_CHECKING:  # torch is imported where it is used: train.py checks the flags before importing it
    import torch
    from torch import nn


@dataclass(frozen=True)
class PrecisionConfig:
    """Megatron's --bf16/--fp16 and loss-scaling flags, resolved."""

    name: str = "fp32"  # fp32 | bf16 | fp16
    loss_scale: float | None = None  # fp16: a constant scale; None: dynamic scaling
    initial_loss_scale: float = 2.0**32
    min_loss_scale: float = 1.0
    loss_scale_window: int = 1000  # clean steps before the scale doubles
    hysteresis: int = 2  # overflowing steps (without a clean window between) before the scale halves

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]

    @property
    def scaled(self) -> bool:
        return self.name == "fp16"


def precision_config(args, cuda: bool) -> PrecisionConfig:
    """The run's precision from train.py's arguments: --fp16, --bf16/--no-bf16, else bf16
    on CUDA and fp32 on CPU. User mistakes raise SailorError (no torch needed)."""
    fp16, bf16 = getattr(args, "fp16", False), getattr(args, "bf16", None)
    if fp16 and bf16:
        raise SailorError("--fp16 and --bf16 exclude each other; choose one (bf16 needs no loss scaling)")
    name = "fp16" if fp16 else "bf16" if (bf16 or (bf16 is None and cuda)) else "fp32"
    scaling = {k: getattr(args, k, None) for k in ("loss_scale", "initial_loss_scale", "min_loss_scale",
                                                   "loss_scale_window", "hysteresis")}
    given = sorted(k for k, v in scaling.items() if v is not None)
    if given and name != "fp16":
        flag = "--" + given[0].replace("_", "-")
        raise SailorError(f"{flag} sets fp16 loss scaling; add --fp16 (bf16 and fp32 are not scaled)")
    config = PrecisionConfig(name, **{k: v for k, v in scaling.items() if v is not None})
    for what, value in (("--loss-scale", config.loss_scale), ("--initial-loss-scale", config.initial_loss_scale),
                        ("--min-loss-scale", config.min_loss_scale)):
        if value is not None and not value > 0:
            raise SailorError(f"{what} must be positive, got {value:g}")
    if config.min_loss_scale > config.initial_loss_scale:
        raise SailorError(f"--min-loss-scale {config.min_loss_scale:g} exceeds --initial-loss-scale "
                          f"{config.initial_loss_scale:g}")
    if config.loss_scale_window < 1 or config.hysteresis < 1:
        raise SailorError("--loss-scale-window and --hysteresis must be at least 1")
    return config


class MainParams:
    """The fp32 main parameter of every model parameter, and its fp32 main gradient (`.grad`).

    `params` maps the model's parameter names to the main parameters: what
    the optimizer steps, grad_sync reduces, checkpoints and snapshots hold.
    Construct it after the model's weights are initialised in fp32: the
    model is then cast to `dtype` and the exact fp32 values stay as masters.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        import torch

        self.model_params = dict(model.named_parameters())
        self.low_precision = dtype != torch.float32
        if not self.low_precision:
            self.params = self.model_params
            return
        self.params = {name: p.detach().clone() for name, p in self.model_params.items()}
        model.to(dtype)  # swaps each Parameter's data in place: the objects (and these names) stay
        for name, param in self.model_params.items():  # (an fp32 router: sailor_ext.moe.MoE, ModelSpec.router_fp32)
            if getattr(param, "sailor_fp32", False):
                param.data = self.params[name].clone()
        for name, param in self.model_params.items():
            param.register_post_accumulate_grad_hook(self._accumulate_into(self.params[name]))

    @staticmethod
    def _accumulate_into(main: torch.Tensor):
        def hook(param: torch.Tensor) -> None:
            # fp32 += bf16/fp16 (promoted): one microbatch's gradient into the fp32 sum
            if main.grad is None:
                main.grad = param.grad.float()
            else:
                main.grad.add_(param.grad)
            param.grad = None

        return hook

    def copy_to_model(self) -> None:
        """Round the main parameters into the model (after a step or a restore)."""
        import torch

        if self.low_precision:
            with torch.no_grad():
                torch._foreach_copy_(list(self.model_params.values()), list(self.params.values()))


class LossScaler:
    """fp16 loss scaling with Megatron's rules (DynamicGradScaler, ConstantGradScaler).

    Dynamic: an overflowing step (inf/nan in any gradient) is skipped and
    counts against `hysteresis`; when `hysteresis` overflows have happened
    without `window` clean steps in between, the scale halves (not below
    `min_scale`). After `window` clean steps in a row the scale doubles and
    the hysteresis budget is restored. Constant (--loss-scale S): the scale
    never changes; overflowing steps are still skipped. The scale is a power
    of two whenever the initial one is, so scaling and unscaling are exact.
    """

    def __init__(self, config: PrecisionConfig):
        self.dynamic = config.loss_scale is None
        self.scale = float(config.loss_scale if not self.dynamic else config.initial_loss_scale)
        self.min_scale, self.window, self.hysteresis = config.min_loss_scale, config.loss_scale_window, \
            config.hysteresis
        self.clean_steps = 0  # Megatron's growth tracker
        self.overflows_left = self.hysteresis  # Megatron's hysteresis tracker

    def update(self, found_inf: bool) -> None:
        if not self.dynamic:
            return
        if found_inf:
            self.clean_steps = 0
            self.overflows_left -= 1
            if self.overflows_left <= 0:
                self.scale = max(self.scale / 2.0, self.min_scale)
            return
        self.clean_steps += 1
        if self.clean_steps == self.window:
            self.clean_steps = 0
            self.overflows_left = self.hysteresis
            self.scale *= 2.0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "overflows_left": self.overflows_left}

    def load_state_dict(self, state: dict | None) -> None:
        """Resume the scale (a checkpoint of an fp32/bf16 run has none: keep the initial scale)."""
        if state and self.dynamic:
            self.scale = float(state["scale"])
            self.clean_steps, self.overflows_left = int(state["clean_steps"]), int(state["overflows_left"])
