"""Leave collectives that wait on a peer that will never answer.

A peer that dies closes its sockets and most collectives waiting on it fail
at once. A peer that hangs (a frozen VM, a network partition) does not:
gloo would wait for the full collective timeout. In torch 2.13
ProcessGroupGloo.abort() and .shutdown() return without waking a blocked
all_reduce, so for gloo we do two things:

  * shut down this process's TCP connections (not listening sockets, whose
    shutdown gloo treats as fatal, and not the store's): every pending gloo
    operation fails with "connection closed";
  * cut every group's default timeout to ABORT_TIMEOUT_S, so an operation
    posted afterwards fails quickly too (we saw a send posted after its peer
    died wait out the whole 30 s timeout without it).

The training loop regains control, and the process group is destroyed and
formed anew under the next epoch.

NCCL (not exercised yet: it needs two GPUs, one rank each) has a working abort. torch's
`_abort_process_group()` calls ncclCommAbort on every communicator of the
process (inside one NCCL group call, so that aborts cannot wait on each
other): kernels waiting for the dead peer return, the training thread's next
collective or synchronisation raises, and the worker goes on to the next
epoch within seconds of the controller's word instead of --dist-timeout.
Without that word (train.py, no controller) NCCL's watchdog ends a
collective after --dist-timeout; devices.backend_for sets
TORCH_NCCL_ASYNC_ERROR_HANDLING=2 so that the watchdog aborts the
communicators and the operation raises, instead of killing the process.
"""
from __future__ import annotations

import datetime
import os
import socket
import stat

import torch
import torch.distributed as dist

ABORT_TIMEOUT_S = 0.5


def abort_collectives(keep_fds: set[int]) -> int:
    """Make every pending collective of this process fail now; returns the
    number of connections shut down (gloo) or -1 (NCCL abort)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        try:
            dist.distributed_c10d._abort_process_group()  # every group; clears torch's registry of them
        except (RuntimeError, ValueError):  # the training thread destroyed them meanwhile
            pass
        return -1
    short = datetime.timedelta(seconds=ABORT_TIMEOUT_S)
    for group in list(dist.distributed_c10d._world.pg_map):
        try:
            group._get_backend(torch.device("cpu"))._set_default_timeout(short)
        except (RuntimeError, AttributeError):
            pass
    severed = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep_fds:
            continue
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM \
                    and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                s.shutdown(socket.SHUT_RDWR)
                severed += 1
        except OSError:
            pass
        finally:
            s.close()
    return severed
