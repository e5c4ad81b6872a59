"""Predict iteration time, peak memory per GPU and dollar cost of a plan."""
