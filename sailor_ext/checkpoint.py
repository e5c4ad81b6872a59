"""Plan-independent checkpoints: the logical model and optimizer, in pieces.

Layout of SAVE/:

    latest                    the name of the newest complete checkpoint
    iter_0000010/meta.json    step, consumed samples, logical shapes, plan (for reference)
    iter_0000010/rank00003.pt pieces this rank is the designated owner of

A piece is a slice [start, stop) along one dimension (or the whole) of one
logical tensor, with its optimizer state (AdamW moments). Each unique chunk is written once,
by its designated owner (sharding.py), so no rank gathers whole tensors.
Loading under any other plan reassembles each local slice from the pieces
that overlap it (files are memory-mapped, only the needed bytes are read).

A checkpoint becomes visible only when complete: ranks write into
iter_X.tmp/ (each file via write-then-rename), meet at a barrier, then rank 0
writes meta.json, renames the directory and atomically replaces `latest`.
A rank dying mid-save leaves only a .tmp directory, which loading ignores.

The three phases (snapshot to CPU, write, commit) are separate functions so
that asynchronous writes, checksums or in-memory copies can slot in between.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from planner.errors import SailorError
from sailor_ext.sharding import ParamShard, chunks_of
from sailor_ext.topology import Topology

FORMAT = "sailor-checkpoint"


@dataclass
class Piece:
    name: str  # logical tensor
    dim: int | None
    start: int
    stop: int
    tensors: dict[str, torch.Tensor]  # "param" and the optimizer's state (exp_avg, ...), on CPU

    def to_dict(self) -> dict:
        return {"name": self.name, "dim": self.dim, "start": self.start, "stop": self.stop, **self.tensors}


def iteration_dir(save: str, step: int) -> Path:
    return Path(save) / f"iter_{step:07d}"


# -- save ---------------------------------------------------------------------
@torch.no_grad()
def snapshot(model, optimizer, shards: dict[str, ParamShard], topology: Topology) -> list[Piece]:
    """CPU copies of the chunks this rank owns, merged into contiguous pieces."""
    params = dict(model.named_parameters())
    pieces: list[Piece] = []
    for chunk in chunks_of(shards, topology):
        if chunk.designated != topology.rank:
            continue
        shard = chunk.shard
        local = {"param": params[chunk.param_name], **optimizer.state_of(chunk.param_name)}
        start, stop = shard.chunk_range(chunk.chunk) if shard.dim is not None else (0, 0)
        last = pieces[-1] if pieces else None
        if last and last.name == shard.name and shard.dim is not None and last.stop == start:
            views = {k: shard.chunk_view(v, chunk.chunk).cpu() for k, v in local.items()}
            last.tensors = {k: torch.cat([last.tensors[k], views[k]], dim=shard.dim) for k in views}
            last.stop = stop
        else:
            views = {k: shard.chunk_view(v, chunk.chunk).detach().to("cpu", copy=True) for k, v in local.items()}
            pieces.append(Piece(shard.name, shard.dim, start, stop, views))
    return pieces


def write_pieces(directory: Path, rank: int, pieces: list[Piece]) -> None:
    path = directory / f"rank{rank:05d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save([p.to_dict() for p in pieces], tmp)
    os.replace(tmp, path)


def save(save_dir: str, step: int, consumed_samples: int, model, optimizer, shards: dict[str, ParamShard],
         topology: Topology, extra: dict | None = None) -> Path:
    """Write a complete checkpoint of `step` (collective: every rank calls it)."""
    final = iteration_dir(save_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if topology.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    write_pieces(tmp, topology.rank, snapshot(model, optimizer, shards, topology))
    dist.barrier()
    if topology.rank == 0:
        meta = {"format": FORMAT, "version": 1, "step": step, "consumed_samples": consumed_samples,
                "optimizer_steps": optimizer.step_count, "optimizer_state": list(optimizer.state_keys),
                **(extra or {})}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest = Path(save_dir) / "latest"
        latest_tmp = latest.with_suffix(".tmp")
        latest_tmp.write_text(final.name + "\n")
        os.replace(latest_tmp, latest)
    dist.barrier()
    return final


# -- load ---------------------------------------------------------------------
@dataclass
class Checkpoint:
    directory: Path
    meta: dict
    pieces: dict[str, list[dict]]  # logical name -> pieces (memory-mapped)

    def assemble(self, name: str, key: str, dim: int | None, start: int, stop: int,
                 shape: tuple[int, ...]) -> torch.Tensor:
        """The slice [start, stop) along `dim` (or the whole) of logical tensor `name`."""
        pieces = self.pieces.get(name)
        if not pieces:
            raise SailorError(f"checkpoint {self.directory} has no tensor {name}; it was saved for another model")
        if dim is None:
            whole = pieces[0][key]
            if tuple(whole.shape) != shape:
                raise SailorError(f"checkpoint {self.directory}: {name} has shape {tuple(whole.shape)} but this model "
                                  f"needs {shape}; load it with the same model (and --make-vocab-size-divisible-by)")
            return whole.clone()
        out = torch.empty(shape)
        filled = 0
        for piece in pieces:
            lo, hi = max(start, piece["start"]), min(stop, piece["stop"])
            if lo >= hi:
                continue
            src = piece[key].narrow(dim, lo - piece["start"], hi - lo)
            out.narrow(dim, lo - start, hi - lo).copy_(src)
            filled += hi - lo
        if filled != stop - start:
            raise SailorError(f"checkpoint {self.directory}: {name} covers only {filled} of rows {start}..{stop}; "
                              "it is incomplete or was saved for another model shape")
        return out


def find_latest(load_dir: str) -> Path | None:
    latest = Path(load_dir) / "latest"
    if not latest.exists():
        return None
    return Path(load_dir) / latest.read_text().strip()


def open_checkpoint(load_dir: str) -> Checkpoint:
    directory = find_latest(load_dir)
    if directory is None:
        if (Path(load_dir) / "meta.json").exists():
            directory = Path(load_dir)
        else:
            raise SailorError(f"no checkpoint in {load_dir} (no 'latest' file); give the --save directory of a "
                              "previous run")
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except FileNotFoundError:
        raise SailorError(f"checkpoint {directory} is incomplete (no meta.json); remove it and load an older one") \
            from None
    if meta.get("format") != FORMAT:
        raise SailorError(f"{directory} is not a sailor checkpoint")
    pieces: dict[str, list[dict]] = {}
    for rank_file in sorted(directory.glob("rank*.pt")):
        for piece in torch.load(rank_file, mmap=True, weights_only=True):
            pieces.setdefault(piece["name"], []).append(piece)
    return Checkpoint(directory, meta, pieces)


@torch.no_grad()
def load(load_dir: str, model, optimizer, shards: dict[str, ParamShard]) -> dict:
    """Fill this rank's parameters and optimizer state; returns the checkpoint's meta.

    The optimizer state is restored when the checkpoint holds the same kind
    (AdamW moments, SGD momentum); switching optimizers keeps only weights.
    """
    ckpt = open_checkpoint(load_dir)
    saved_state = tuple(ckpt.meta.get("optimizer_state", ()))
    restore_state = saved_state == optimizer.state_keys
    optimizer.step_count = ckpt.meta["optimizer_steps"]
    for pname, param in model.named_parameters():
        shard = shards[pname]
        where = (shard.dim, *shard.local_range(), shard.local_shape)
        param.copy_(ckpt.assemble(shard.name, "param", *where))
        if restore_state and saved_state:
            optimizer.set_state(pname, {key: ckpt.assemble(shard.name, key, *where) for key in saved_state})
    return ckpt.meta


def read_logical(load_dir: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(meta, {logical name: full parameter}) of a checkpoint, for tests and tools."""
    ckpt = open_checkpoint(load_dir)
    out = {}
    for name, pieces in ckpt.pieces.items():
        dim = pieces[0]["dim"]
        if dim is None:
            out[name] = pieces[0]["param"].clone()
        else:
            ordered = sorted(pieces, key=lambda p: p["start"])
            out[name] = torch.cat([p["param"] for p in ordered], dim=dim)
    return ckpt.meta, out
