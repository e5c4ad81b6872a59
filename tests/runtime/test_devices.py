"""Strict device mode (sailor_ext/devices.py) catches what NCCL would refuse, in one gloo process.

The multi-process runtime and elastic tests run with it on (conftest.py); here it is turned on in
this process for a moment, to show what it flags and what it lets through.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _runtime_helpers import free_port

from sailor_ext import devices


@pytest.fixture
def strict():
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    cpu = torch.device("cpu")
    devices.configure(cpu, strict=True)
    yield cpu
    devices.disable()
    devices.configure(cpu, strict=False)


def test_a_cpu_tensor_on_a_nccl_typed_group_fails(strict):
    """A CUDA run's groups take CUDA tensors only: a CPU tensor handed to one is refused before any
    communication, as NCCL would refuse it (the comm device is what a CUDA run would have)."""
    devices.configure(torch.device("cuda", 0), strict=True)
    with pytest.raises(devices.StrictDeviceError, match="a cpu tensor .* of a cuda:0 run"):
        dist.all_reduce(torch.ones(3))
    with pytest.raises(devices.StrictDeviceError, match="batch_isend_irecv"):
        dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(3), 0)])


def test_host_memory_is_flagged_until_it_moves_to_the_device(strict):
    """On CPU the device is host memory too, so host memory is tracked: a snapshot's copy, a checkpoint's
    tensor, or a tensor the runtime makes without a device, and whatever is computed from them."""
    from sailor_ext.model import init_tensor

    live = torch.ones(4, device=strict)  # on the device
    dist.all_reduce(live)
    snapshot = devices.to_host(live)
    for host in (snapshot, torch.cat([snapshot, snapshot]), snapshot.narrow(0, 1, 2).reshape(2, 1),
                 init_tensor("layers.1.mlp.linear_fc1.weight", (8, 4), 1, 2)):  # torch.randn(shape) in sailor_ext
        assert isinstance(host, devices.HostTensor)
        with pytest.raises(devices.StrictDeviceError, match="host-memory tensor"):
            dist.all_reduce(host)
        with pytest.raises(devices.StrictDeviceError, match="irecv"):
            dist.batch_isend_irecv([dist.P2POp(dist.irecv, host, 0)])
        moved = host.to(strict)  # the device-aware path: .to(device)
        assert type(moved) is torch.Tensor
        dist.all_reduce(moved)
    # a checkpoint piece is saved without the marker (torch.load(weights_only=True) refuses unknown types)
    assert type(devices.plain(snapshot)) is torch.Tensor
    # megatron's and torch's own tensors (made outside sailor_ext) are theirs to place: not flagged
    assert type(torch.zeros(2)) is torch.Tensor


def test_strict_mode_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(devices.STRICT_ENV, raising=False)
    devices.configure(torch.device("cpu"))
    assert not devices.is_strict()
    assert type(devices.to_host(torch.ones(2))) is torch.Tensor
