"""The elastic tests: helpers live in _elastic_helpers.py."""
from __future__ import annotations

import os

# Strict device mode for every worker these tests start (sailor_ext/devices.py; see tests/runtime/conftest.py).
os.environ.setdefault("SAILOR_STRICT_DEVICE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process training runs (seconds each)")
    # megatron-core's import (sailor_ext.model's init_tensor, for the bf16 comparison) uses torch.jit
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
