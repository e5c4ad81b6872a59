"""The in-memory reshard moves snapshot slices only as device tensors (strict device mode).

Snapshots live in host memory. Under NCCL a slice must be copied to the GPU
before it is sent, and received into a GPU buffer; gloo on CPU takes the host
tensors as they are, so only strict mode (sailor_ext/devices.py, on for this
suite in conftest.py) can tell on this machine. Two ranks: rank 0 holds a
step-5 snapshot of a [8, 3] weight (whole, TP 1) and its AdamW moments and
donates it; rank 1, TP rank 1 of 2 in the new plan, needs rows 4..7 and
takes them from rank 0's memory. The values use fp32's whole mantissa (bf16
cannot hold them): the masters of a bf16 run move exactly.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
from _runtime_helpers import free_port  # noqa: E402

SCRIPT = r"""
import os, sys
import torch, torch.distributed as dist
from sailor_ext import devices
from sailor_ext.elastic import reshard
from sailor_ext.sharding import ParamShard
from sailor_ext.snapshot import SnapshotRing

class Adam:  # what reshard and snapshots ask of the runtime's Optimizer
    state_keys = ("exp_avg", "exp_avg_sq")
    def __init__(self, params):
        self.params, self.step_count, self.state = params, 0, {}
    def state_of(self, name):
        return self.state.get(name) or {k: torch.zeros_like(self.params[name]) for k in self.state_keys}
    def set_state(self, name, tensors):
        self.state[name] = {k: v.to(self.params[name].device).clone() for k, v in tensors.items()}
    def copy_state_into(self, buffers):
        for name, held in buffers.items():
            for k, v in self.state_of(name).items():
                held[k].copy_(v)

rank = int(os.environ["RANK"])
device = torch.device("cpu")
devices.configure(device)
assert devices.is_strict(), "strict mode must be on for this test"
dist.init_process_group("gloo", rank=rank, world_size=2)
full = torch.arange(24.0).view(8, 3) / 7  # fp32 values a bf16 weight cannot hold
ring = SnapshotRing()
if rank == 0:  # held whole (TP 1) at step 5
    shards = {"w": ParamShard("w", (8, 3), 0, 1, 0, 1, (0,))}
    params = {"w": full.clone()}
    adam = Adam(params)
    adam.state["w"] = {"exp_avg": full + 100, "exp_avg_sq": full + 200}
    adam.step_count = 5
    ring.take(params, adam, shards, (), step=5, consumed=60, loss_scaler={"scale": 1024.0})
    info = reshard.exchange(ring, None, adam, None, [0, 1], device)  # a donor
else:  # needs TP rank 1 of 2: rows 4..7
    shards = {"w": ParamShard("w", (8, 3), 0, 2, 1, 2, (0,))}
    params = {"w": torch.zeros(4, 3)}
    adam = Adam(params)
    info = reshard.exchange(ring, params, adam, shards, [0, 1], device)
    assert torch.equal(params["w"], full[4:]) and not torch.equal(full[4:], full[4:].bfloat16().float())
    assert torch.equal(adam.state["w"]["exp_avg_sq"], full[4:] + 200)
    assert type(params["w"]) is torch.Tensor and adam.step_count == 5
assert info.step == 5 and info.consumed == 60 and info.loss_scaler == {"scale": 1024.0}, info
print("ok", flush=True)
dist.barrier()  # both ranks tear the group down: left to the interpreter's exit, gloo's destructor
dist.destroy_process_group()  # can find the peer gone and abort ("terminate called ...")
"""


@pytest.mark.timeout(120)
def test_reshard_sends_device_tensors_only(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "SAILOR_STRICT_DEVICE": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env={**env, "RANK": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=100)[0] for p in procs]
    failed = [f"rank {r}:\n{out[-2000:]}" for r, (p, out) in enumerate(zip(procs, outs))
              if p.returncode != 0 or "ok" not in out]
    assert not failed, "\n".join(failed)
