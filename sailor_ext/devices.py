"""Where communicated tensors must live, and a strict mode that checks it on CPU.

The rule: every tensor handed to a collective or a point-to-point operation
lives on the rank's device (set by `configure`): its CUDA device under NCCL,
which moves nothing else, and the CPU under gloo. Host memory (snapshots,
checkpoint reads, tensors made without device=) is moved there with
`.to(device)` first.

On a CPU-only machine the device *is* host memory, so a snapshot's host copy
sent as it is works under gloo and fails only on GPUs. Strict mode
(SAILOR_STRICT_DEVICE=1; the runtime and elastic test suites turn it on)
treats every process group as NCCL-typed and makes that visible on CPU:

  * host memory is marked (a `HostTensor`): `to_host` (snapshot copies) and
    `as_host` (checkpoint reads) return marked tensors, and so do tensor
    factories called from sailor_ext code without a device (`torch.empty(n)`
    lands on the CPU on a GPU machine too) or with a device string "cpu",
    `.cpu()`, and `.to("cpu")`. Operations on a HostTensor give HostTensors
    (cat, narrow, clone, reshape: host memory stays host memory); `.to(d)`
    with a torch.device `d`, the runtime's way of naming its device, gives
    a plain tensor: the move to the device;
  * every collective and point-to-point function of torch.distributed
    (all_reduce, all_gather(_into_tensor), reduce_scatter(_tensor),
    broadcast, reduce, gather, scatter, all_to_all(_single), send, recv,
    isend, irecv, batch_isend_irecv) checks its tensors first: a HostTensor,
    or a tensor whose device type is not the comm device's, raises
    StrictDeviceError.

torch's own object collectives (all_gather_object, broadcast_object_list)
place their buffers themselves and are not checked. With CUDA, strict mode
checks real devices too: a CPU tensor handed to a gloo group of a CUDA run is
flagged as it would be under NCCL.
"""
from __future__ import annotations

import functools
import os
import sys

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

STRICT_ENV = "SAILOR_STRICT_DEVICE"
CHECKED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
           "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend",
           "irecv")
P2P = ("send", "recv", "isend", "irecv")
FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
             torch.randperm, torch.arange, torch.linspace, torch.eye, torch.tensor, torch.empty_strided}

_comm_device = torch.device("cpu")
_strict: _Strict | None = None


class StrictDeviceError(AssertionError):
    """A tensor handed to a collective that NCCL would refuse (a programming error, not a peer failure)."""


class HostTensor(torch.Tensor):
    """Host memory, in strict mode. torch's default __torch_function__ keeps the
    subclass through every operation, so whatever is made from host memory is marked too."""


# -- backends ----------------------------------------------------------------------------
def backend_for(device: torch.device, requested: str | None = None) -> str:
    """The process group backend: NCCL on CUDA, gloo on CPU (or gloo on CUDA when asked: several
    ranks sharing one GPU, which NCCL refuses; gloo all-reduces and broadcasts CUDA tensors but
    cannot send or all-gather them, so only plans without pipeline stages run that way)."""
    from planner.errors import SailorError

    backend = requested or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise SailorError("--distributed-backend nccl needs CUDA GPUs, and none is visible; use gloo on CPU")
    if backend == "nccl":
        # How NCCL ends a collective whose peer died or hung. torch's default (3) kills the process
        # when its watchdog sees the timeout; 2 ("CleanUpOnly") aborts the communicators and lets the
        # pending operation raise, so train.py can say which rank failed and exit 3, and an elastic
        # worker survives to join the next epoch (its watcher aborts at once on the controller's
        # word: elastic/abort.py). Not exercised yet: it needs two GPUs (NCCL takes one rank per GPU).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    return backend


def strict_requested() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def configure(device: torch.device, strict: bool | None = None) -> None:
    """Set this process's comm device; turn strict mode on where asked (default: SAILOR_STRICT_DEVICE)."""
    global _comm_device
    _comm_device = device
    if (strict_requested() if strict is None else strict) and _strict is None:
        _enable()


def is_strict() -> bool:
    return _strict is not None


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host-memory copy (snapshots): it must go back with .to(device) before it is communicated."""
    return _mark(tensor.detach().to("cpu", copy=True))


def as_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, marked as host memory in strict mode (no copy): checkpoint files read from disk."""
    return _mark(tensor)


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """Without the strict-mode marker (torch.save would record the subclass; torch.load refuses it)."""
    return tensor.as_subclass(torch.Tensor) if isinstance(tensor, HostTensor) else tensor


def _mark(tensor):
    if _strict is not None and isinstance(tensor, torch.Tensor) and not isinstance(tensor, HostTensor):
        return tensor.as_subclass(HostTensor)
    return tensor


# -- strict mode ---------------------------------------------------------------------
def _from_runtime(depth: int) -> bool:
    """Was the torch call made by sailor_ext code? (megatron's and torch's own factories
    without a device are theirs to place: megatron's CPU initialisation, optimizer steps)"""
    return sys._getframe(depth).f_globals.get("__name__", "").startswith("sailor_ext")


def _device_arg(args, kwargs):
    """The target of Tensor.to(...): a str/torch.device, a tensor (its device), or None (dtype only)."""
    for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
        if isinstance(a, (str, torch.device, torch.Tensor)):
            return a
    return None


def _names_host(target) -> bool:
    """Does a device argument ask for host memory? None (a factory's default) and the string "cpu" do;
    a torch.device is how the runtime names its own device."""
    return target is None or (isinstance(target, str) and target.startswith("cpu"))


class _HostMemoryMode(TorchFunctionMode):
    """Marks the tensors the runtime creates in host memory, and unmarks them when they move to the device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in FACTORIES:
            if _names_host(kwargs.get("device")) and _from_runtime(2):
                return _mark(out)
        elif func is torch.Tensor.to:
            target = _device_arg(args, kwargs)
            if target is None:  # a dtype change: host memory stays host memory
                return out
            host = isinstance(target, HostTensor) if isinstance(target, torch.Tensor) else _names_host(target)
            if not host:
                return plain(out)  # moved to the device
            if _from_runtime(2):
                return _mark(out)
        elif func is torch.Tensor.cpu and _from_runtime(2):
            return _mark(out)
        return out


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def check(where: str, tensors) -> None:
    """Raise StrictDeviceError for any tensor NCCL would refuse (strict mode only)."""
    if _strict is None:
        return
    for t in tensors:
        if isinstance(t, HostTensor):
            raise StrictDeviceError(
                f"{where}: a host-memory tensor {tuple(t.shape)} {t.dtype} (a snapshot or checkpoint copy, or a "
                f"tensor made without device=) handed to a collective; NCCL needs it on {_comm_device}: move it "
                "with .to(device) first")
        if t.device.type != _comm_device.type:
            raise StrictDeviceError(f"{where}: a {t.device} tensor {tuple(t.shape)} handed to a collective of a "
                                    f"{_comm_device} run; move it with .to(device) first")


class _Strict:
    """The installed mode and the original torch.distributed functions."""

    def __init__(self):
        c10d = dist.distributed_c10d
        self.originals = {name: getattr(dist, name) for name in (*CHECKED, "batch_isend_irecv")}
        for name in CHECKED:
            setattr(dist, name, self._checked(name, self.originals[name]))
        # P2POp accepts only torch's own isend/irecv (compared by identity in distributed_c10d), so the
        # point-to-point functions are replaced there too; torch's other collectives keep calling the
        # originals (the object collectives place their own buffers)
        for name in P2P:
            setattr(c10d, name, getattr(dist, name))
        dist.batch_isend_irecv = self._batch
        self.mode = _HostMemoryMode()
        self.mode.__enter__()

    @staticmethod
    def _checked(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            check(name, _tensors([args, list(kwargs.values())]))
            return fn(*args, **kwargs)

        return wrapper

    def _batch(self, ops):
        for op in ops:
            check(f"batch_isend_irecv ({getattr(op.op, '__name__', op.op)})", [op.tensor])
        return self.originals["batch_isend_irecv"](ops)

    def close(self) -> None:
        self.mode.__exit__(None, None, None)
        for name, fn in self.originals.items():
            setattr(dist, name, fn)
            if name in P2P:
                setattr(dist.distributed_c10d, name, fn)


def _enable() -> None:
    global _strict
    _strict = _Strict()


def disable() -> None:
    """Leave strict mode (tests that turn it on in their own process)."""
    global _strict
    if _strict is not None:
        _strict.close()
        _strict = None
