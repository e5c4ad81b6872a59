"""Fixtures of the profiler tests: one small profiling run of the tiny model, shared."""
from __future__ import annotations

from pathlib import Path

import pytest
from _profiler_helpers import QUICK, sailor


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture(scope="session")
def tiny_profile(tmp_path_factory) -> Path:
    """`sailor profile model` on the tiny model: microbatches 1 and 2, TP 1 and 2 (seconds)."""
    out = tmp_path_factory.mktemp("profiles")
    run = sailor("profile", "model", "--model", "tiny", "--device", "cpu", "--micro-batch-sizes", "1,2", "--tp", "1,2",
                 *QUICK, "-o", out)
    assert run.returncode == 0, run.stderr[-3000:]
    return out
