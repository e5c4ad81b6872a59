"""Plan-independent checkpoints: the logical model and optimizer, in pieces, at any fsspec URL.

Layout below SAVE (a local directory, s3://bucket/prefix, gs://..., node:NAME; storage.py):

    latest                              "iter_0000010 <SHA-256 of its meta.json>"
    iter_0000010/meta.json              sealed: {"sha256": <of the body's bytes>, "meta": <body>}; the body has
                                        step, consumed samples, optimizer steps, the RNG rule and the index
                                        of every rank file: where each tensor lies, and the SHA-256 of
                                        each block of its rows (BLOCK_BYTES)
    iter_0000010/rank00003-1f2e3d4c.bin the raw bytes of the pieces rank 3 is the designated owner of

A piece is a slice [start, stop) along one dimension (or the whole) of one
logical tensor, with its optimizer state (AdamW moments). Parameters are the
fp32 main (master) weights whatever the run's precision (precision.py), so a
bf16 run resumes exactly and a checkpoint resumes under any precision. Each
unique chunk is written once, by its designated owner (sharding.py), so no
rank gathers whole tensors. Loading under any other plan (stages, TP degrees,
replica counts, microbatch sizes, GPU types) reassembles each local slice from
the pieces that overlap it, reading only the blocks of rows that hold it.

Commit, with nothing but atomic whole-object writes (no rename, which an
object store lacks): every rank writes its file under a name of its own
(a random suffix: a step saved again never overwrites a committed file) and
reports its index through a store (snapshot.py); rank 0 then writes meta.json
and, last, `latest`. A directory without meta.json is an unfinished save,
which loading ignores and a later commit deletes.

Damage: every byte is covered. Rank files hold nothing but tensor bytes, each
block of rows with its SHA-256 in meta.json, and every file its size; meta.json
carries the SHA-256 of its own body, byte for byte; `latest` carries the
SHA-256 of the meta.json it names. Verification is incremental: rank 0 checks
only meta.json and `latest` (kilobytes), and each rank checks the blocks it
reads, which it has to read anyway; no rank re-hashes the whole checkpoint.
The ranks agree on the outcome (Trainer.load); a damaged checkpoint makes all
of them fall back to the newest older one that verifies, and rank 0 says so in
one line.

Why not torch.distributed.checkpoint (DCP): see docs/runtime.md, "Checkpoints".
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import re
import uuid
from dataclasses import dataclass, field

import torch

from planner.errors import SailorError
from planner.inputs import Doc, short
from sailor_ext import devices
from sailor_ext.sharding import ParamShard
from sailor_ext.storage import NotAFile, Storage, open_storage

FORMAT = "sailor-checkpoint"
VERSION = 3  # 3: raw tensor files, SHA-256 per block of rows, a sealed meta.json and `latest` (2: torch.save)
# A tensor is hashed in blocks of whole rows (dim 0) of about this size, so a rank that needs
# some rows of a piece reads and hashes only the blocks that hold them.
BLOCK_BYTES = 4 << 20
_ITER = re.compile(r"^iter_(\d{7})$")
_LATEST = re.compile(r"^(iter_\d{7}) ([0-9a-f]{64})\n$")
_SEAL_HEAD, _SEAL_MID, _SEAL_TAIL = b'{"sha256": "', b'", "meta": ', b"}\n"


class Damaged(Exception):
    """A checkpoint's bytes are not what it committed: what is wrong, in a few words."""


@dataclass
class Piece:
    name: str  # logical tensor
    dim: int | None
    start: int
    stop: int
    tensors: dict[str, torch.Tensor]  # "param" and the optimizer's state (exp_avg, ...), on CPU


@dataclass(frozen=True)
class FileRecord:
    """A written rank file: its size and the index of its tensors (meta.json lists them)."""

    name: str
    bytes: int
    pieces: list = field(default_factory=list)  # [{name, dim, start, stop, tensors: {key: {dtype, shape, offset,
    #                                             sha256}}}]


def _rows(shape, itemsize: int) -> tuple[int, int]:
    """(rows, bytes per row) of a tensor stored row-major: rows along dim 0 (a scalar is one row)."""
    rows = shape[0] if len(shape) else 1
    numel = 1
    for d in shape:
        numel *= d
    return rows, (numel // rows * itemsize) if rows else 0


def iteration_name(step: int) -> str:
    return f"iter_{step:07d}"


def _sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


# -- writing --------------------------------------------------------------------------
def write_pieces(storage: Storage, step: int, rank: int, pieces: list[Piece]) -> FileRecord:
    """One rank's file of raw tensor bytes, hashed in blocks of rows, written whole (atomically)."""
    buffer, index = io.BytesIO(), []
    for p in pieces:
        entry = {"name": p.name, "dim": p.dim, "start": p.start, "stop": p.stop, "tensors": {}}
        for key, tensor in p.tensors.items():
            t = devices.plain(tensor).detach().cpu().contiguous()
            raw = memoryview(t.reshape(-1).view(torch.uint8).numpy())
            rows, row_bytes = _rows(t.shape, t.dtype.itemsize)
            per = max(1, BLOCK_BYTES // row_bytes) if row_bytes else max(rows, 1)  # whole rows, ~BLOCK_BYTES
            block = per * row_bytes or 1
            entry["tensors"][key] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                                     "offset": buffer.tell(), "block_rows": per,
                                     "sha256": [_sha(raw[i:i + block]) for i in range(0, max(len(raw), 1), block)]}
            buffer.write(raw)
        index.append(entry)
    name = f"rank{rank:05d}-{uuid.uuid4().hex[:8]}.bin"
    data = buffer.getbuffer()
    storage.put(f"{iteration_name(step)}/{name}", data)
    return FileRecord(name, len(data), index)


def seal(body: dict) -> bytes:
    """meta.json's bytes: valid JSON whose every byte its own SHA-256 covers."""
    text = json.dumps(body, indent=1).encode()
    return _SEAL_HEAD + _sha(text).encode() + _SEAL_MID + text + _SEAL_TAIL


def unseal(data: bytes) -> dict:
    head, mid = len(_SEAL_HEAD), len(_SEAL_HEAD) + 64
    body_at = mid + len(_SEAL_MID)
    if not (data.startswith(_SEAL_HEAD) and data[mid:body_at] == _SEAL_MID and data.endswith(_SEAL_TAIL)):
        raise Damaged("meta.json is not in its sealed form (damaged, or written by another program)")
    body = data[body_at:-len(_SEAL_TAIL)]
    if _sha(body).encode() != data[head:mid]:
        raise Damaged("meta.json fails its SHA-256 checksum")
    try:
        meta = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Damaged("meta.json is not JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise Damaged("meta.json is not a sailor checkpoint's")
    if meta.get("version") == VERSION:  # (another version is refused by name where it is opened)
        try:
            _check_index(meta)
        except SailorError as e:
            raise Damaged(f"meta.json is malformed: {str(e).removeprefix('meta.json: ')}") from None
    return meta


_RANK_FILE = re.compile(r"^rank\d{5}-[0-9a-f]{8}\.bin$")  # write_pieces' names: never a path elsewhere
_DTYPES = ("float32", "bfloat16", "float16", "float64")  # parameters and optimizer state
_HUGE = 1 << 50


def _check_index(meta: dict) -> None:
    """Every field a load reads, checked (SailorError naming it). Sealed means unchanged since written, not
    written by this sailor: a hand-made or foreign meta.json must be refused, not crash or load garbage."""
    top = Doc(meta, "meta.json").fields(("step", "consumed_samples", "optimizer_steps", "files"), open_ended=True)
    for key in ("step", "consumed_samples", "optimizer_steps"):
        top[key].int(0, _HUGE)
    if "optimizer_state" in top:
        for key in top["optimizer_state"].items():
            key.str()
    if "loss_scaler" in top:
        top["loss_scaler"].fields(open_ended=True)
    for name, rec in top["files"].entries():
        if not _RANK_FILE.match(name):
            rec.fail("listed under a rank file's name (rankNNNNN-xxxxxxxx.bin)", f"not {short(name)}")
        f = rec.fields(("bytes", "pieces"))
        size = f["bytes"].int(0, _HUGE)
        for piece in f["pieces"].items():
            p = piece.fields(("name", "dim", "start", "stop", "tensors"))
            p["name"].str()
            dim = None if p["dim"].value is None else p["dim"].int(0, 7)
            start, stop = p["start"].int(0, _HUGE), p["stop"].int(0, _HUGE)
            for _, tensor in p["tensors"].entries():
                t = tensor.fields(("dtype", "shape", "offset", "block_rows", "sha256"))
                itemsize = getattr(torch, t["dtype"].str(_DTYPES)).itemsize
                shape = [d.int(0, _HUGE) for d in t["shape"].items(0, 8)]
                if dim is not None and (dim >= len(shape) or shape[dim] != stop - start):
                    t["shape"].fail(f"a shape whose dimension {dim} spans the piece's rows {start}..{stop}")
                numel = math.prod(shape)
                if t["offset"].int(0, _HUGE) + numel * itemsize > size:
                    t["offset"].fail(f"an offset that leaves its {numel * itemsize} bytes inside the file's {size}")
                per = t["block_rows"].int(1, _HUGE)
                rows = shape[0] if shape else 1
                blocks = -(-rows // per) if numel else 1
                hashes = t["sha256"].items(blocks, blocks)
                for h in hashes:
                    if not (isinstance(h.value, str) and re.fullmatch("[0-9a-f]{64}", h.value)):
                        h.fail("a SHA-256 in hex")


def commit(storage: Storage, step: int, files: list[FileRecord], meta: dict, keep: int = 0) -> str:
    """Make the rank files of `step` its committed checkpoint (rank 0 only): meta.json, then `latest`."""
    name = iteration_name(step)
    body = {"format": FORMAT, "version": VERSION, "step": step, **meta,
            "files": {f.name: {"bytes": f.bytes, "pieces": f.pieces} for f in sorted(files, key=lambda f: f.name)}}
    sealed = seal(body)
    storage.put(f"{name}/meta.json", sealed)
    storage.put("latest", f"{name} {_sha(sealed)}\n".encode())
    for stale in set(storage.children(name)) - set(body["files"]) - {"meta.json"}:
        storage.remove(f"{name}/{stale}")  # an older save of this step, or a cancelled epoch's file
    _prune(storage, step, keep)
    return storage.where(name)


def _prune(storage: Storage, newest: int, keep: int) -> None:
    """Drop unfinished saves older than `newest` and committed checkpoints beyond `keep`."""
    done = []
    for name in _iterations(storage):
        if "meta.json" in storage.children(name):
            done.append(name)
        elif _step(name) < newest:
            storage.remove(name)
    if keep > 0:
        for name in done[keep:]:
            storage.remove(name)


# -- choosing what to load ---------------------------------------------------------------
def _iterations(storage: Storage) -> list[str]:
    """iter_* names under the root, newest first (committed or not)."""
    return sorted((n for n in storage.children() if _ITER.match(n)), reverse=True)


def _step(name: str) -> int:
    m = _ITER.match(name)
    return int(m.group(1)) if m else -1


def claimed(load_dir: str) -> tuple[str, int] | None:
    """(name, step) of the newest checkpoint the directory claims, unverified (cheap): what
    `latest` names, else the newest iter_* directory with a meta.json; None if there is none."""
    storage = open_storage(load_dir)
    try:
        m = _LATEST.match(storage.get("latest").decode(errors="replace"))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, NotAFile):
        m = None
    if m:
        return m.group(1), _step(m.group(1))
    done = [n for n in _iterations(storage) if "meta.json" in storage.children(n)]
    return (done[0], _step(done[0])) if done else None


def read_meta(storage: Storage, name: str) -> tuple[dict, bytes]:
    """(meta, meta.json's bytes) of checkpoint `name`; Damaged if it does not verify."""
    try:
        data = storage.get(f"{name}/meta.json")
    except FileNotFoundError:
        raise Damaged("no meta.json") from None
    except (IsADirectoryError, NotADirectoryError, NotAFile):  # meta.json a directory, or iter_NNNNNNN a file
        raise Damaged("meta.json is not a file") from None
    if not data.startswith(_SEAL_HEAD):
        try:
            old = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = None
        if isinstance(old, dict) and old.get("format") == FORMAT and old.get("version") != VERSION:
            raise SailorError(f"checkpoint {storage.where(name)} has format version {old.get('version')}; this "
                              f"sailor reads version {VERSION}: resume it with the sailor that wrote it")
    return unseal(data), data


@dataclass(frozen=True)
class Choice:
    root: str  # the --load URL
    name: str  # iter_XXXXXXX
    step: int
    skipped: tuple[tuple[str, str], ...] = ()  # (what, why): newer checkpoints or `latest` that failed

    @property
    def directory(self) -> str:
        return f"{self.root.rstrip('/')}/{self.name}"

    def notes(self) -> list[str]:
        """At most one line: what was damaged, and what resumes instead."""
        if not self.skipped:
            return []
        damaged = "; ".join(f"{what} is damaged ({why})" for what, why in self.skipped)
        return [f"checkpoint {damaged}; resuming from {self.directory} (step {self.step}) instead"]


def choose(load_dir: str, known_bad: tuple[tuple[str, str], ...] = ()) -> Choice:
    """The newest checkpoint under `load_dir` whose meta.json and `latest` verify (or `load_dir`
    itself if it is one checkpoint directory), skipping the names in `known_bad` (their data
    failed on some rank). Only kilobytes are read: the tensors are verified as they are loaded."""
    storage = open_storage(load_dir)
    root, bad = storage.url, dict(known_bad)
    if not storage.exists("latest") and storage.exists("meta.json"):  # one checkpoint directory
        parent, _, name = root.rpartition("/")
        try:
            meta, _ = read_meta(open_storage(parent or "/"), name)
        except Damaged as e:
            raise SailorError(f"checkpoint {root} is damaged ({e}); load its parent directory to fall back to an "
                              "older checkpoint") from None
        if name in bad:
            raise SailorError(f"checkpoint {root} is damaged ({bad[name]})")
        return Choice(parent, name, meta["step"])
    names = _iterations(storage)
    skipped: list[tuple[str, str]] = []
    try:
        pointer = storage.get("latest")
    except (FileNotFoundError, NotADirectoryError):  # (NotADirectory: load_dir is a file, so nothing is in it)
        pointer = None
    except (IsADirectoryError, NotAFile):
        pointer = b"not a file"  # damaged: it names nothing
    m = _LATEST.match(pointer.decode(errors="replace")) if pointer is not None else None
    first = m.group(1) if m and m.group(1) in names else None
    if first is not None:
        try:
            _, sealed = read_meta(storage, first)
            if _sha(sealed) != m.group(2):  # meta.json verifies by itself: the pointer is what changed
                skipped.append((storage.where("latest"), f"its SHA-256 of {first}/meta.json does not match"))
                first = None
        except Damaged:
            pass  # the checkpoint it names is damaged: skipped below, with the reason
    elif pointer is not None:
        skipped.append((storage.where("latest"), f"it names {m.group(1)}, which is missing" if m else
                        "it does not name a checkpoint as 'iter_NNNNNNN SHA256'"))
    if first is not None:  # `latest` first, then older ones; newer ones would belong to another history
        names = [first] + [n for n in names if _step(n) < _step(first)]
    if not names:
        raise SailorError(f"no checkpoint in {load_dir}; give the --save directory of a previous run")
    for name in names:
        where = storage.where(name)
        if name in bad:
            skipped.append((where, bad[name]))
            continue
        try:
            meta, _ = read_meta(storage, name)
        except Damaged as e:
            if name != first and str(e) == "no meta.json":
                continue  # an unfinished save: never committed, nothing lost
            skipped.append((where, str(e)))
            continue
        return Choice(root, name, meta["step"], tuple(skipped))
    if not skipped:
        raise SailorError(f"no committed checkpoint in {load_dir}; give the --save directory of a previous run")
    details = "; ".join(f"{what}: {why}" for what, why in skipped)
    raise SailorError(f"every checkpoint in {load_dir} is damaged ({details}); nothing safe to resume from")


# -- reading --------------------------------------------------------------------------
@dataclass
class Checkpoint:
    storage: Storage  # the root
    name: str
    meta: dict
    pieces: dict[str, list[dict]]  # logical name -> index entries (+ "file")
    _read: dict = field(default_factory=dict)  # (id of a tensor's entry, first block, end block) -> rows
    _sizes: set = field(default_factory=set)  # files whose size was checked

    @property
    def directory(self) -> str:
        return self.storage.where(self.name)

    def tensor(self, piece: dict, key: str) -> torch.Tensor:
        """One stored tensor, read and checked against its SHA-256s (Damaged if one fails)."""
        rows, _ = _rows(piece["tensors"][key]["shape"], 1)
        return self.rows(piece, key, 0, rows).reshape(piece["tensors"][key]["shape"])

    def rows(self, piece: dict, key: str, lo: int, hi: int) -> torch.Tensor:
        """Rows [lo, hi) (dim 0) of one stored tensor; only the blocks holding them are read and checked."""
        file, rec = piece["file"], piece["tensors"][key]
        path = f"{self.name}/{file}"
        if file not in self._sizes:
            want = self.meta["files"][file]["bytes"]
            try:
                size = self.storage.size(path)
            except FileNotFoundError:
                raise Damaged(f"{file} is missing") from None
            if size != want:
                raise Damaged(f"{file} has {size} bytes, expected {want} (truncated or overwritten)")
            self._sizes.add(file)
        dtype, shape, per = getattr(torch, rec["dtype"]), rec["shape"], rec["block_rows"]
        rows, row_bytes = _rows(shape, dtype.itemsize)
        b0, b1 = lo // per, max(-(-hi // per), lo // per + 1)
        first, last = b0 * per, min(b1 * per, rows)
        cached = self._read.get((id(rec), b0, b1))  # rec: this tensor's entry in self.meta
        if cached is None:
            cached = torch.empty((last - first, *shape[1:]) if shape else (), dtype=dtype)
            raw = memoryview(cached.reshape(-1).view(torch.uint8).numpy())
            start = rec["offset"] + first * row_bytes
            got = self.storage.read_into(path, start, raw)
            for i, b in enumerate(range(b0, b1)):
                part = raw[i * per * row_bytes:(i + 1) * per * row_bytes]
                if got < len(raw) or _sha(part) != rec["sha256"][b]:
                    at = start + i * per * row_bytes
                    raise Damaged(f"{file} fails its SHA-256 checksum (bytes {at}..{at + len(part)}: "
                                  f"{piece['name']} {key})")
            cached = devices.as_host(cached)
            self._read[(id(rec), b0, b1)] = cached
        return cached.narrow(0, lo - first, hi - lo) if shape else cached

    def assemble(self, name: str, key: str, dim: int | None, start: int, stop: int,
                 shape: tuple[int, ...]) -> torch.Tensor:
        """The slice [start, stop) along `dim` (or the whole) of logical tensor `name`."""
        pieces = self.pieces.get(name)
        if not pieces:
            raise SailorError(f"checkpoint {self.directory} has no tensor {name}; it was saved for another model")
        for piece in pieces:
            stored = piece["tensors"].get(key, {}).get("shape")
            if stored is None:
                raise SailorError(f"checkpoint {self.directory}: {name} has no {key}; it was saved by another "
                                  "optimizer or program")
            if (piece["dim"] is not None and piece["dim"] != dim) or len(stored) != len(shape) \
                    or any(a != b for d, (a, b) in enumerate(zip(stored, shape)) if d != dim):
                raise SailorError(f"checkpoint {self.directory}: {name} was saved with shape {tuple(stored)} "
                                  f"(split along {piece['dim']}) but this model needs {shape}; load it with the "
                                  "same model (and --make-vocab-size-divisible-by)")
        if dim is None:
            return self.tensor(pieces[0], key).clone()
        out = torch.empty(shape)
        filled = 0
        for piece in pieces:
            lo, hi = max(start, piece["start"]), min(stop, piece["stop"])
            if lo >= hi:
                continue
            if dim == 0:  # only the rows needed
                src = self.rows(piece, key, lo - piece["start"], hi - piece["start"])
            else:
                src = self.tensor(piece, key).narrow(dim, lo - piece["start"], hi - lo)
            out.narrow(dim, lo - start, hi - lo).copy_(src)
            filled += hi - lo
        if filled != stop - start:
            raise SailorError(f"checkpoint {self.directory}: {name} covers only {filled} of rows {start}..{stop}; "
                              "it is incomplete or was saved for another model shape")
        return out


def open_choice(choice: Choice) -> Checkpoint:
    """The chosen checkpoint's index (its meta.json, verified again: it is a few kilobytes)."""
    storage = open_storage(choice.root)
    try:
        meta, _ = read_meta(storage, choice.name)
    except Damaged as e:
        raise SailorError(f"checkpoint {choice.directory} is damaged ({e})") from None
    if meta.get("version") != VERSION:
        raise SailorError(f"checkpoint {choice.directory} has format version {meta.get('version')}; this sailor "
                          f"reads version {VERSION}")
    pieces: dict[str, list[dict]] = {}
    for file, rec in meta["files"].items():
        for piece in rec["pieces"]:
            pieces.setdefault(piece["name"], []).append({**piece, "file": file})
    return Checkpoint(storage, choice.name, meta, pieces)


@torch.no_grad()
def load_into(ckpt: Checkpoint, params: dict[str, torch.Tensor], optimizer, shards: dict[str, ParamShard]) -> dict:
    """Fill this rank's (fp32 main) parameters and optimizer state; returns the checkpoint's meta.
    Raises Damaged if a tensor it reads fails its checksum (the caller falls back).

    The optimizer state is restored when the checkpoint holds the same kind
    (AdamW moments, SGD momentum); switching optimizers keeps only weights.
    """
    saved_state = tuple(ckpt.meta.get("optimizer_state", ()))
    restore_state = saved_state == optimizer.state_keys
    optimizer.step_count = ckpt.meta["optimizer_steps"]  # before set_state: AdamW's state carries it
    for pname, param in params.items():
        shard = shards[pname]
        where = (shard.dim, *shard.local_range(), shard.local_shape)
        shard.view(param).copy_(ckpt.assemble(shard.name, "param", *where))
        if restore_state and saved_state:
            optimizer.set_state(pname, {key: ckpt.assemble(shard.name, key, *where) for key in saved_state})
    ckpt._read.clear()
    return ckpt.meta


def load_logical(load_dir: str) -> tuple[Choice, dict, dict[str, torch.Tensor]]:
    """(choice, meta, {logical name: full parameter}) of the newest checkpoint whose every byte
    verifies (every tensor and its optimizer state is read and checked): what the ranks of any
    plan together read, in one process, for tests and tools."""
    bad: list[tuple[str, str]] = []
    while True:
        choice = choose(load_dir, tuple(bad))
        ckpt = open_choice(choice)
        try:
            out = {}
            for name, pieces in ckpt.pieces.items():
                for piece in pieces:
                    for key in piece["tensors"]:
                        ckpt.tensor(piece, key)
                dim = pieces[0]["dim"]
                if dim is None:
                    out[name] = ckpt.tensor(pieces[0], "param").clone()
                else:
                    ordered = sorted(pieces, key=lambda p: p["start"])
                    out[name] = torch.cat([ckpt.tensor(p, "param") for p in ordered], dim=dim)
            return choice, ckpt.meta, out
        except Damaged as e:
            bad.append((choice.name, str(e)))


def read_logical(load_dir: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(meta, {logical name: full parameter}): load_logical without the choice."""
    _, meta, out = load_logical(str(load_dir))
    return meta, out
