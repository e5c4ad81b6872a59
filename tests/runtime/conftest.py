"""Fixtures of the runtime tests; helpers live in _runtime_helpers.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Strict device mode for every training process these tests start (they inherit the environment):
# process groups are treated as NCCL-typed, so a host tensor handed to a collective fails here as it
# would on GPUs (sailor_ext/devices.py).
os.environ.setdefault("SAILOR_STRICT_DEVICE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process training runs (seconds each)")
    # megatron-core's import-time notices about optional CUDA extensions
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")
