"""Plan-independent checkpoints on disk: the logical model and optimizer, in pieces.

Layout of SAVE/:

    latest                    the name of the newest committed checkpoint
    iter_0000010/meta.json    step, consumed samples, optimizer steps, RNG rule,
                              and the size and SHA-256 of every rank file
    iter_0000010/rank00003.pt pieces this rank is the designated owner of

A piece is a slice [start, stop) along one dimension (or the whole) of one
logical tensor, with its optimizer state (AdamW moments). Parameters are the
fp32 main (master) weights whatever the run's precision (precision.py), so a
bf16 run resumes exactly and a checkpoint resumes under any precision. Each
unique chunk is written once, by its designated owner (sharding.py), so no
rank gathers whole tensors. Loading under any other plan (stages, TP degrees, replica counts,
microbatch sizes, GPU types) reassembles each local slice from the pieces
that overlap it (files are memory-mapped, only the needed bytes are read).

Atomicity: ranks write into iter_X.eE.tmp/ (E: the elastic epoch, so two
epochs never mix their files), each file via write, fsync, rename. Rank 0
commits once every rank has reported its file (through a store, see
snapshot.py): meta.json with the checksums, rename to iter_X/, then `latest`
is replaced atomically. A crash before the commit leaves a .tmp directory,
which loading ignores. A committed checkpoint that was damaged later (a
truncated or flipped file) fails its checksum; loading then falls back to the
newest older checkpoint that verifies, and says so.

Why not torch.distributed.checkpoint: its resharding describes a tensor's
layout with one DTensor/ShardedTensor placement per tensor, which cannot say
"replica 0 holds it in 4 column slices, replica 1 in 2"; its async save runs
collectives on a process group that an elastic reconfiguration tears down;
and it has neither checksums nor an in-memory copy. We use torch.save/load
(memory-mapped) for the files and write the layout, the checksums and the
commit protocol ourselves.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from planner.errors import SailorError
from sailor_ext import devices
from sailor_ext.sharding import ParamShard

FORMAT = "sailor-checkpoint"
VERSION = 2  # 2 adds file checksums and the RNG rule
_ITER = re.compile(r"^iter_(\d{7})$")


@dataclass
class Piece:
    name: str  # logical tensor
    dim: int | None
    start: int
    stop: int
    tensors: dict[str, torch.Tensor]  # "param" and the optimizer's state (exp_avg, ...), on CPU

    def to_dict(self) -> dict:
        return {"name": self.name, "dim": self.dim, "start": self.start, "stop": self.stop,
                **{k: devices.plain(v) for k, v in self.tensors.items()}}


@dataclass(frozen=True)
class FileRecord:
    """A written rank file: what meta.json lists to verify it later."""

    name: str
    bytes: int
    sha256: str


def iteration_dir(save: str | Path, step: int) -> Path:
    return Path(save) / f"iter_{step:07d}"


def staging_dir(save: str | Path, step: int, epoch: int) -> Path:
    return Path(save) / f"iter_{step:07d}.e{epoch}.tmp"


# -- writing --------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_pieces(directory: Path, rank: int, pieces: list[Piece]) -> FileRecord:
    """One rank's file: serialised in memory, checksummed, written, fsynced, renamed."""
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save([p.to_dict() for p in pieces], buffer)
    data = buffer.getbuffer()
    path = directory / f"rank{rank:05d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return FileRecord(path.name, len(data), hashlib.sha256(data).hexdigest())


def commit(save_dir: str | Path, step: int, epoch: int, files: list[FileRecord], meta: dict,
           keep: int = 0) -> Path:
    """Make staging_dir(step, epoch) the committed checkpoint of `step` (rank 0 only)."""
    save = Path(save_dir)
    tmp, final = staging_dir(save, step, epoch), iteration_dir(save, step)
    meta = {"format": FORMAT, "version": VERSION, "step": step, **meta,
            "files": {f.name: {"bytes": f.bytes, "sha256": f.sha256} for f in sorted(files, key=lambda f: f.name)}}
    meta_tmp = tmp / "meta.json.tmp"
    with open(meta_tmp, "w") as f:
        f.write(json.dumps(meta, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(meta_tmp, tmp / "meta.json")
    _fsync_dir(tmp)
    old = None
    if final.exists():  # a step saved again (resumed from an older checkpoint): swap, never delete first
        old = final.with_name(final.name + f".e{epoch}.old")
        os.replace(final, old)
    os.replace(tmp, final)
    latest, latest_tmp = save / "latest", save / "latest.tmp"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, latest)
    _fsync_dir(save)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _prune(save, step, keep)
    return final


def _prune(save: Path, newest: int, keep: int) -> None:
    """Drop staging leftovers older than `newest` and committed checkpoints beyond `keep`."""
    for d in save.glob("iter_*.tmp"):
        m = re.match(r"^iter_(\d{7})\.", d.name)
        if m and int(m.group(1)) <= newest:
            shutil.rmtree(d, ignore_errors=True)
    if keep > 0:
        for d in committed(save)[keep:]:
            shutil.rmtree(d, ignore_errors=True)


# -- choosing what to load ---------------------------------------------------------------
def committed(save_dir: str | Path) -> list[Path]:
    """Committed checkpoint directories, newest first."""
    save = Path(save_dir)
    if not save.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in save.iterdir() if (m := _ITER.match(d.name)) and d.is_dir()]
    return [d for _, d in sorted(found, reverse=True)]


def find_latest(load_dir: str | Path) -> Path | None:
    latest = Path(load_dir) / "latest"
    if not latest.exists():
        return None
    return Path(load_dir) / latest.read_text().strip()


def read_meta(directory: Path) -> dict:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except FileNotFoundError:
        raise SailorError(f"checkpoint {directory} is incomplete (no meta.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SailorError(f"checkpoint {directory} has a damaged meta.json") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SailorError(f"{directory} is not a sailor checkpoint")
    return meta


def verify(directory: Path) -> str | None:
    """None if the checkpoint is complete and every file matches its checksum,
    else what is wrong, in a few words."""
    try:
        meta = read_meta(directory)
    except SailorError as e:
        return str(e).split(": ", 1)[-1] if ": " in str(e) else str(e)
    files = meta.get("files")
    if files is None:  # version 1: no checksums to check
        return None if any(directory.glob("rank*.pt")) else "no rank files"
    for name, want in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != want["bytes"]:
            return f"{name} has {size} bytes, expected {want['bytes']} (truncated or overwritten)"
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        if digest.hexdigest() != want["sha256"]:
            return f"{name} fails its SHA-256 checksum (corrupted)"
    return None


@dataclass(frozen=True)
class Choice:
    directory: Path
    step: int
    skipped: tuple[tuple[Path, str], ...]  # newer checkpoints that failed verification, and why

    def notes(self) -> list[str]:
        return [f"checkpoint {d} is damaged ({why}); resuming from {self.directory} (step {self.step}) instead"
                for d, why in self.skipped]


def choose(load_dir: str | Path) -> Choice:
    """The newest checkpoint under `load_dir` that verifies (or `load_dir` itself
    if it is one checkpoint directory)."""
    root = Path(load_dir)
    if (root / "meta.json").exists() and not (root / "latest").exists():
        problem = verify(root)
        if problem:
            raise SailorError(f"checkpoint {root} is damaged ({problem}); load its parent directory to fall back "
                              "to an older checkpoint")
        return Choice(root, read_meta(root)["step"], ())
    candidates = committed(root)
    latest = find_latest(root)
    if latest is not None and latest in candidates:  # `latest` first, then older ones
        candidates = [latest] + [d for d in candidates if d != latest and _step(d) < _step(latest)]
    if not candidates:
        raise SailorError(f"no checkpoint in {load_dir}; give the --save directory of a previous run")
    skipped = []
    for d in candidates:
        problem = verify(d)
        if problem is None:
            return Choice(d, read_meta(d)["step"], tuple(skipped))
        skipped.append((d, problem))
    details = "; ".join(f"{d.name}: {why}" for d, why in skipped)
    raise SailorError(f"every checkpoint in {load_dir} is damaged ({details}); nothing safe to resume from")


def _step(directory: Path) -> int:
    m = _ITER.match(directory.name)
    return int(m.group(1)) if m else -1


# -- reading --------------------------------------------------------------------------
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


def open_directory(directory: Path) -> Checkpoint:
    meta = read_meta(directory)
    pieces: dict[str, list[dict]] = {}
    for rank_file in sorted(directory.glob("rank*.pt")):
        for piece in torch.load(rank_file, mmap=True, weights_only=True):
            piece = {k: devices.as_host(v) if isinstance(v, torch.Tensor) else v for k, v in piece.items()}
            pieces.setdefault(piece["name"], []).append(piece)
    return Checkpoint(directory, meta, pieces)


def open_checkpoint(load_dir: str | Path) -> Checkpoint:
    """The newest checkpoint that verifies (see `choose`)."""
    return open_directory(choose(load_dir).directory)


@torch.no_grad()
def load_into(ckpt: Checkpoint, params: dict[str, torch.Tensor], optimizer, shards: dict[str, ParamShard]) -> dict:
    """Fill this rank's (fp32 main) parameters and optimizer state; returns the checkpoint's meta.

    The optimizer state is restored when the checkpoint holds the same kind
    (AdamW moments, SGD momentum); switching optimizers keeps only weights.
    """
    saved_state = tuple(ckpt.meta.get("optimizer_state", ()))
    restore_state = saved_state == optimizer.state_keys
    optimizer.step_count = ckpt.meta["optimizer_steps"]
    for pname, param in params.items():
        shard = shards[pname]
        where = (shard.dim, *shard.local_range(), shard.local_shape)
        shard.view(param).copy_(ckpt.assemble(shard.name, "param", *where))
        if restore_state and saved_state:
            optimizer.set_state(pname, {key: ckpt.assemble(shard.name, key, *where) for key in saved_state})
    return ckpt.meta


def read_logical(load_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
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
