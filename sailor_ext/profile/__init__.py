"""`sailor profile`: measure a model's layers and the network on the user's own hardware.

The torch side of the profiler (the planner never imports it):

  * timing.py   - wall clock on CPU, CUDA events on GPU; medians
  * layers.py   - builds the runtime's own megatron-core layers (sailor_ext.model) and
                  measures per-layer forward/backward time, saved-activation bytes,
                  parameters and the optimizer step
  * worker.py   - one process of a profiling run (a TP group, plus CPU "load" ranks
                  that reproduce the contention of a plan's co-located processes)
  * model_profile.py - the `sailor profile model` driver: spawns workers per TP degree,
                  shows progress, resumes, writes DIR/MODEL/GPU/profile.json
  * network.py  - the `sailor profile network` worker: p2p and all-reduce timings
                  between ranks labelled with their node and zone
  * device.py   - which GPU type this is, and the software versions
  * ranks.py    - starts a run's ranks on this machine and collects rank 0's output
"""
