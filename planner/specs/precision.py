"""Training precision: which one a plan trains in, and what each GPU type can run.

    fp32   fp32 weights, gradients and activations (CPU runs)
    bf16   bf16 weights and activations, fp32 main gradients, master weights and Adam state
    fp16   the same in fp16 with loss scaling (GPUs without bf16: V100, T4, Turing cards)

The default follows the target, as the runtime's does (sailor_ext/precision.py:
bf16 on CUDA, fp32 on CPU): fp32 if every GPU type is the CPU, else bf16 if
every GPU type has bf16, else fp16 (one precision per run: a V100 among A100s
makes the whole run fp16). `sailor plan` applies it to each plan's own GPU
types, not to all those offered. A plan records its precision, and `sailor
launch` passes it to the runtime (launch_flags).
"""
from __future__ import annotations

from collections.abc import Iterable

from planner.errors import SailorError

PRECISIONS = ("fp32", "bf16", "fp16")
CPU = "CPU"


def default_precision(gpus: Iterable) -> str:
    """The precision a run on these GPU types (GPUSpecs) takes by default."""
    gpus = list(gpus)
    if all(g.name == CPU for g in gpus):
        return "fp32"
    return "bf16" if all(g.bf16 for g in gpus) else "fp16"


def check_precision(precision: str, gpus: Iterable = (), where: str = "--precision") -> str:
    """`precision`, if it is one and every GPU type (GPUSpec) can run it; else a one-line SailorError."""
    if precision not in PRECISIONS:
        raise SailorError(f"{where}: unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        lacking = sorted(g.name for g in gpus if not g.bf16)
        if lacking:
            raise SailorError(f"{where}: {', '.join(lacking)} cannot run bf16; use fp16 (or fp32), or leave "
                              "those GPUs out")
    return precision


def resolve_precision(given: str | None, gpus: Iterable, recorded: str | None = None,
                      what: str = "the plan") -> str:
    """The precision of a command: the plan's (`recorded`), else --precision (`given`), else the default.
    A --precision that contradicts the plan is refused: its split and microbatches were chosen for its own."""
    gpus = list(gpus)
    if recorded is not None and given is not None and given != recorded:
        raise SailorError(f"--precision {given} contradicts {what}, which was made for {recorded}; drop the flag, "
                          f"or make a plan for {given} with `sailor plan --precision {given}`")
    return check_precision(recorded or given or default_precision(gpus), gpus,
                           "plan" if recorded and not given else "--precision")


# sailor_ext.train's flags (Megatron's) for each precision
RUNTIME_FLAGS = {"fp32": "--no-bf16", "bf16": "--bf16", "fp16": "--fp16"}


def flags_precision(train_args: list[str]) -> str | None:
    """The precision sailor_ext.train's arguments ask for (None: they leave it to the default)."""
    fp16 = "--fp16" in train_args
    bf16 = [a for a in train_args if a in ("--bf16", "--no-bf16")]
    if fp16:
        return "fp16"
    if bf16:
        return "bf16" if bf16[-1] == "--bf16" else "fp32"
    return None


def launch_flags(precision: str | None, train_args: list[str]) -> list[str]:
    """train_args with the plan's precision flag in front (nothing to add if the plan records none);
    a flag after '--' that asks for another precision is refused."""
    if precision is None:
        return list(train_args)
    asked = flags_precision(train_args)
    if asked is not None and asked != precision:
        raise SailorError(f"the plan trains in {precision} but the training arguments ask for {asked}; drop the "
                          f"flag, or make a plan for {asked} with `sailor plan --precision {asked}`")
    return list(train_args) if asked else [RUNTIME_FLAGS[precision], *train_args]
