"""Timing one piece of work: wall clock on CPU, CUDA events on a GPU.

On a GPU the host returns long before the kernels finish, so a wall clock
around a layer measures launch time; CUDA events on the stream measure the
kernels. Each measurement is repeated and the median kept: one slow
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

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    @property
    def kind(self) -> str:
        return "cuda events" if self.cuda else "perf_counter"

    def time(self, fn: Callable[[], T]) -> tuple[T, float]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return out, start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


STATISTICS = {"median": median, "mean": mean}
