"""A rank's training state in host memory, and its asynchronous trip to disk.

Taking a checkpoint has two parts:

  1. snapshot (blocks the step, briefly): copy every local fp32 main
     parameter (precision.py: the masters, not a bf16 model's rounded
     weights) and its optimizer state into host buffers that are reused from
     one snapshot to the next, with the step, consumed samples, optimizer
     step count and the fp16 loss scaler's state;
  2. persist (a background thread, while training goes on): cut the snapshot
     into the chunks this rank is the designated owner of, write them
     (checkpoint.write_pieces: SHA-256 per block of rows, one atomic write to a
     local directory or an object store), and report the file's index through
     a key-value store; rank 0 waits for every rank's report and commits
     (checkpoint.commit).

The newest two snapshots stay in memory. After a reconfiguration the ranks
of the new plan rebuild their shards from the survivors' snapshots
(elastic/reshard.py) without reading the disk. Two, because when a peer dies
during step k+1 a rank may have finished k+1 while another has not, but
every rank has finished step k.

The store reports need no collective, so the background thread never
touches a process group (which an elastic reconfiguration may tear down
under it); a commit that cannot complete because a rank died leaves only files no
meta.json names.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from sailor_ext import checkpoint, devices
from sailor_ext.checkpoint import FileRecord, Piece
from sailor_ext.sharding import ParamShard
from sailor_ext.storage import open_storage

IN_MEMORY = 2


@dataclass
class Snapshot:
    """One rank's whole local state after step `step`."""

    step: int
    consumed: int
    optimizer_steps: int
    state_keys: tuple[str, ...]
    shards: dict[str, ParamShard]  # local parameter name -> its logical tensor and slice
    tensors: dict[str, dict[str, torch.Tensor]]  # local name -> {"param", *state_keys}, host memory
    designated: tuple[tuple[str, int], ...]  # (local name, chunk) this rank writes to disk
    loss_scaler: dict | None = None  # fp16: precision.LossScaler.state_dict()
    persisted: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self.persisted.set()

    def pieces(self) -> list[Piece]:
        """The designated chunks as contiguous pieces (adjacent chunks merged)."""
        out: list[Piece] = []
        for pname, c in self.designated:
            shard = self.shards[pname]
            start, stop = shard.chunk_range(c) if shard.dim is not None else (0, 0)
            views = {k: shard.chunk_view(v, c) for k, v in self.tensors[pname].items()}
            last = out[-1] if out else None
            if last and last.name == shard.name and shard.dim is not None and last.stop == start:
                last.tensors = {k: torch.cat([last.tensors[k], views[k]], dim=shard.dim) for k in views}
                last.stop = stop
            else:
                out.append(Piece(shard.name, shard.dim, start, stop, {k: v.clone() for k, v in views.items()}))
        return out


class SnapshotRing:
    """The newest IN_MEMORY snapshots; buffers are reused when the layout matches."""

    def __init__(self, size: int = IN_MEMORY):
        self.size = size
        self.slots: list[Snapshot] = []  # oldest first

    def newest(self) -> Snapshot | None:
        return self.slots[-1] if self.slots else None

    def clear(self) -> None:
        for s in self.slots:
            s.persisted.wait()
        self.slots = []

    @torch.no_grad()
    def take(self, params: dict[str, torch.Tensor], optimizer, shards: dict[str, ParamShard], designated, step: int,
             consumed: int, loss_scaler: dict | None = None) -> Snapshot:
        """params: the fp32 main parameters by local name (precision.MainParams.params)."""
        reuse = None
        if len(self.slots) >= self.size:
            reuse = self.slots.pop(0)
            reuse.persisted.wait()  # its bytes may still be on their way to disk
            if reuse.shards != shards:
                reuse = None
        tensors: dict[str, dict[str, torch.Tensor]] = {}  # in the logical layout (ParamShard.view)
        for name, param in params.items():
            if reuse is not None:
                tensors[name] = reuse.tensors[name]
            else:
                tensors[name] = {k: devices.as_host(torch.empty(shards[name].local_shape))
                                 for k in ("param", *optimizer.state_keys)}
            tensors[name]["param"].copy_(shards[name].view(param))
        optimizer.copy_state_into(tensors)  # the distributed optimizer gathers its parts here (collective)
        snap = Snapshot(step, consumed, optimizer.step_count, tuple(optimizer.state_keys), dict(shards), tensors,
                        tuple(designated), loss_scaler)
        self.slots.append(snap)
        return snap


# -- persisting ---------------------------------------------------------------------------
class StoreBoard:
    """Ranks report their written files through a key-value store; rank 0 collects them.

    `store` is anything with set(key, value), check([keys]) and get(key): a
    torch.distributed.Store or planner.elastic.store.StoreClient.
    """

    def __init__(self, store, prefix: str):
        self.store, self.prefix = store, prefix

    def _key(self, step: int, rank: int) -> str:
        return f"{self.prefix}{step}/rank{rank}"

    def report(self, step: int, rank: int, record: FileRecord) -> None:
        self.store.set(self._key(step, rank), json.dumps(record.__dict__))

    def collect(self, step: int, world: int, deadline: float, cancelled: threading.Event) -> list[FileRecord] | None:
        keys = [self._key(step, r) for r in range(world)]
        while not self.store.check(keys):
            if cancelled.is_set() or time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return [FileRecord(**json.loads(self.store.get(k))) for k in keys]


@dataclass(frozen=True)
class PersistTarget:
    """Where and under which world this rank's snapshots go."""

    save_dir: str  # a local directory or an fsspec URL (storage.py)
    rank: int
    world: int
    epoch: int = 0  # the elastic epoch (or torchrun restart) that writes
    keep: int = 0  # committed checkpoints to keep (0: all)
    timeout_s: float = 300.0  # how long rank 0 waits for the others' files


class Persister:
    """Writes submitted snapshots in a background thread, in order; rank 0 commits."""

    def __init__(self, target: PersistTarget, board: StoreBoard, meta: dict,
                 log: Callable[[str], None] = lambda line: None):
        self.target, self.board, self.meta, self.log = target, board, meta, log
        self.storage = open_storage(target.save_dir)
        self.queue: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.committed: list[int] = []  # steps rank 0 committed
        self.failure: str | None = None  # the first failed save, in one line
        self.thread = threading.Thread(target=self._work, name="checkpoint-writer", daemon=True)
        self.thread.start()

    def submit(self, snap: Snapshot) -> None:
        snap.persisted.clear()
        self.queue.put(snap)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted snapshot is written (and, on rank 0, committed)."""
        done = threading.Event()
        self.queue.put(done)
        return done.wait(timeout)

    def close(self, cancel: bool = False) -> None:
        if cancel:
            self.cancelled.set()
        self.queue.put(None)
        self.thread.join(timeout=None if not cancel else 5.0)

    def _work(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                if not self.cancelled.is_set():
                    self._persist(item)
            except BaseException as e:  # keep training; the failure is reported once
                if self.failure is None:
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
                    self.failure = f"checkpoint of step {item.step} failed on rank {self.target.rank}: {first}"
                    self.log(self.failure)
            finally:
                item.persisted.set()

    def _persist(self, snap: Snapshot) -> None:
        t = self.target
        record = checkpoint.write_pieces(self.storage, snap.step, t.rank, snap.pieces())
        self.board.report(snap.step, t.rank, record)
        if t.rank != 0:
            return
        files = self.board.collect(snap.step, t.world, time.monotonic() + t.timeout_s, self.cancelled)
        if files is None:
            if not self.cancelled.is_set():
                self.log(f"checkpoint of step {snap.step} not committed: not every rank wrote its file within "
                         f"{t.timeout_s:g} s")
            return
        meta = {"consumed_samples": snap.consumed, "optimizer_steps": snap.optimizer_steps,
                "optimizer_state": list(snap.state_keys), "world_size": t.world, **self.meta,
                **({"loss_scaler": snap.loss_scaler} if snap.loss_scaler is not None else {})}
        checkpoint.commit(self.storage, snap.step, files, meta, t.keep)
        self.committed.append(snap.step)
