"""Timing one piece of work: wall clock on CPU, CUDA events on a GPU.

On a GPU a layer costs whichever is longer: launching its kernels (host time,
Python included) or running them. So each layer is timed twice at once: the
host's wall clock around the launch, and CUDA events around its kernels,
queued behind a sleep kernel long enough for the host to have launched them
all before the GPU reaches them (the events then see the kernels alone, with
no launch gaps); the layer's time is the larger. On an H100 a 1.1 B LLaMA
block's forward took 2.5, 1.9 and 2.3 ms at microbatches 1, 2 and 4, nearly
flat: below 4 the host's launch set the pace. One event pair after a synchronize, the timer before
this one, adds launch gaps to the kernels: it over-predicted that model's
steps by 21-42 %. (Blocks are then rescaled to their back-to-back time:
profile/layers.py.) Each measurement is repeated and the median kept: one slow
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
