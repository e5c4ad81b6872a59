"""Measurements the simulator stands on: per-layer compute and memory, network curves."""
