"""sailor planner: the sidecar that models, simulates and plans training runs.

Data flows one way: specs -> profiles -> simulator -> search -> controller.
Nothing here imports torch.
"""

__version__ = "0.1.0"  # the fallback of `sailor --version` when the package is not installed
