"""Timing one piece of work: wall clock on CPU, CUDA events on a GPU.

On a GPU a layer costs whichever is longer: launching its kernels (host time,
Python included) or running them. Training keeps the GPU's queue full, so a
layer's kernels run back to back when the host is ahead, and the GPU idles
between them when it is behind (small microbatches: measured on an H100, a
1.1 B LLaMA block at microbatch 1 and 2 took the host's time, not the GPU's).
So each layer is timed twice at once: the host's wall clock around the launch,
and CUDA events around its kernels, queued behind a sleep kernel long enough
for the host to have launched them all before the GPU reaches them (the
events then see the kernels alone, with no launch gaps). The layer's time is
the larger. A single event pair without the sleep, after a synchronize, adds
the two instead: it over-predicted a 1.1 B model's step by 21-42 %. Each measurement is repeated and the median kept: one slow
repetition (a page fault, another process taking the core) does not move it.
Where more processes are busy than there are cores, being descheduled is not
an outlier but the steady state (each process gets cores/processes of a core
over time, in slices longer than a layer), and only the mean sees it.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


class Clock:
    """Seconds taken by `fn()`, measured the way the device needs."""

    MAX_SLEEP_S = 0.05

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.cycles_per_s = _sleep_cycles_per_s()
            self.sleep_s = 0.002  # grows to twice the longest launch seen (the warm-up repetitions find it)

    @property
    def kind(self) -> str:
        return "max(host launch, cuda events)" if self.cuda else "perf_counter"

    def time(self, fn: Callable[[], T]) -> tuple[T, float]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(self.sleep_s * self.cycles_per_s))  # the GPU waits while the host launches
            start.record()
            t0 = time.perf_counter()
            out = fn()
            host = time.perf_counter() - t0
            end.record()
            end.synchronize()
            self.sleep_s = min(self.MAX_SLEEP_S, max(self.sleep_s, 2 * host))
            return out, max(host, start.elapsed_time(end) / 1e3)
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0


def _sleep_cycles_per_s() -> float:
    """GPU clock cycles per second of torch.cuda._sleep (a spin kernel), measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # first launch: loads the kernel
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / (start.elapsed_time(end) / 1e3)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


STATISTICS = {"median": median, "mean": mean}
