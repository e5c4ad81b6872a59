"""sailor planner: the sidecar that models, simulates and plans training runs.

Data flows one way: specs -> profiles -> simulator -> search -> controller.
Nothing here imports torch.
"""
