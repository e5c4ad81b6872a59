"""Search: co-optimize GPU allocation and the parallelization plan."""
