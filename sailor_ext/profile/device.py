"""What this machine is: the GPU type a profile is for, and the software that measured it.

The GPU type names a profile (`DIR/MODEL/GPU/profile.json`) and must match the
names plans and cluster files use, so CUDA's device name is mapped onto the
catalog (planner.specs.hardware); memory size tells A100-40 from A100-80.
Without CUDA the type is "CPU", the catalog's pseudo-GPU for CPU-only runs.
"""
from __future__ import annotations

import datetime
import platform
import re
import sys
from importlib import metadata

import torch

from planner.errors import SailorError
from planner.specs.hardware import canonical_gpu

# (pattern in torch.cuda.get_device_name, memory threshold GiB or None, catalog name)
_CUDA_NAMES = (
    (r"GH200", None, "GH200-96"),
    (r"H200", None, "H200"),
    (r"H100", None, "H100-80"),
    (r"A100", 60, ("A100-40", "A100-80")),
    (r"V100", None, "V100-16"),
    (r"\bL4\b", None, "L4"),
    (r"\bT4\b", None, "T4"),
    (r"3090", None, "RTX-3090"),
    (r"2080", None, "RTX-2080"),
    (r"TITAN RTX|Titan RTX", None, "Titan-RTX"),
)


def gpu_type_of(name: str, memory_bytes: int) -> str | None:
    """Catalog name of a CUDA device from its name and memory, or None if unknown."""
    for pattern, threshold, catalog in _CUDA_NAMES:
        if re.search(pattern, name, re.IGNORECASE):
            if threshold is None:
                return catalog
            small, large = catalog
            return large if memory_bytes >= threshold * 2**30 else small
    return None


def detect_gpu_type(device: str) -> str:
    """The GPU type of `device` ("cpu" or "cuda"), named as in the catalog."""
    if device == "cpu":
        return "CPU"
    props = torch.cuda.get_device_properties(0)
    found = gpu_type_of(props.name, props.total_memory)
    if found is None:
        raise SailorError(f"cannot map CUDA device {props.name!r} to a known GPU type; pass --gpu NAME "
                          "(and describe it under 'gpus:' in a cluster file if it is new)")
    return found


def resolve_gpu(name: str | None, device: str) -> str:
    """--gpu as given (catalog spelling where it is a known type), else detected."""
    if name:
        return canonical_gpu(name) or name
    return detect_gpu_type(device)


def device_facts(device: str, threads: int, concurrency: int) -> dict:
    """What measured the profile, for people reading it later."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"type": "cuda", "name": props.name, "memory_bytes": props.total_memory,
                "count": torch.cuda.device_count(), "cuda": torch.version.cuda}
    return {"type": "cpu", "name": _cpu_name(), "threads_per_process": threads,
            "concurrent_processes": concurrency, "cores": cores()}


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """CPU cores this process may run on."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def software_versions() -> dict:
    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for package in ("megatron-core", "sailor"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return out


def today() -> str:
    return datetime.date.today().isoformat()
