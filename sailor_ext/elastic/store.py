"""The controller's store as a `torch.distributed.Store`, for process groups.

Process groups bootstrap through the same store as everything else (under a
per-epoch prefix pg/<e>/), so no training node hosts a rendezvous server
whose loss would stop the job. Blocking reads wait in short slices and give
up as soon as `cancelled` is set (the epoch they belong to was superseded),
so a rank never waits out a timeout for peers that will not come.
"""
from __future__ import annotations

import datetime
import threading
import time

import torch.distributed as dist

from planner.elastic.store import StoreClient, StoreTimeout

SLICE_S = 0.1


class EpochSuperseded(RuntimeError):
    """The controller moved on while this rank was still forming the old epoch."""


class ControllerStore(dist.Store):
    """torch's Store interface over a StoreClient connection."""

    def __init__(self, client: StoreClient, timeout_s: float = 300.0):
        super().__init__()
        self.client = client
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self.cancelled = threading.Event()

    def _blocking(self, attempt, what: str, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            if self.cancelled.is_set():
                raise EpochSuperseded(f"epoch superseded while waiting for {what}")
            try:
                return attempt(min(SLICE_S, max(0.0, deadline - time.monotonic())))
            except StoreTimeout:
                if time.monotonic() >= deadline:
                    raise dist.DistStoreError(f"timed out after {timeout_s:g} s waiting for "
                                              f"{what} in the job's store") from None

    # torch calls these (from C++ through pybind's trampoline)
    def set(self, key, value):
        self.client.set(key, value if isinstance(value, (bytes, str)) else bytes(value))

    def get(self, key):
        return self._blocking(lambda t: self.client.get(key, t), key, self._timeout.total_seconds())

    def add(self, key, value):
        return self.client.add(key, int(value))

    def compare_set(self, key, expected, desired):
        return self.client.compare_set(key, expected, desired)

    def check(self, keys):
        return self.client.check(list(keys))

    def wait(self, keys, timeout=None):
        t = timeout.total_seconds() if timeout is not None and timeout.total_seconds() > 0 else \
            self._timeout.total_seconds()
        self._blocking(lambda s: self.client.wait(list(keys), s), ", ".join(keys), t)

    def delete_key(self, key):
        return self.client.delete(key)

    def num_keys(self):
        return self.client.num_keys()

    def set_timeout(self, timeout):
        self._timeout = timeout

    @property
    def timeout(self):
        return self._timeout
