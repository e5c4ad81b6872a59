"""Elastic training: the sidecar controller, node agents and the job's store.

Torch-free (the controller runs where torch is not installed); the worker
side lives in sailor_ext.elastic. See docs/elasticity.md.
"""
