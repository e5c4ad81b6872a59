"""The elastic tests: helpers live in _elastic_helpers.py."""
from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process training runs (seconds each)")
