"""The elastic tests: helpers live in _elastic_helpers.py."""
from __future__ import annotations

import os

# Strict device mode for every worker these tests start (sailor_ext/devices.py; see tests/runtime/conftest.py).
os.environ.setdefault("SAILOR_STRICT_DEVICE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process training runs (seconds each)")
