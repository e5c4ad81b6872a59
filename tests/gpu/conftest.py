"""The GPU suite: helpers come from tests/runtime; strict device mode is on, and on CUDA it checks real devices."""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
os.environ.setdefault("SAILOR_STRICT_DEVICE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process training runs (seconds each)")  # test_equivalence's
