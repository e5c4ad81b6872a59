"""What the user describes: the model, the hardware and cluster, the plan."""
