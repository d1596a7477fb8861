"""Crash-safe checkpoints on disk in the project's own tensor format; never pickle.

A checkpoint is a directory ``ckpt-<step:012d>/`` holding one file per part (e.g.
``algorithm.part``, ``replay.part``, ``learner.part``) plus ``manifest.json`` with each
file's size and sha256. It is written into a temporary directory, fsynced and renamed
into place, so a crash leaves either the whole checkpoint or none of it. Loading walks
back from the newest checkpoint, skipping (with a warning) any that is incomplete or
corrupt; the next save moves those aside to ``ckpt-<step>.broken``, so that they no longer
count among the ``keep`` newest. The ``best/`` slot keeps the policy of the best evaluation
the same way.

A part file is::

    MAGIC (8 bytes) | header length (uint64 LE) | msgpack header | raw tensor data

The header is ``{"values": {name: plain}, "tensors": [{"name", "dtype", "shape"}, ...]}``
where plain values are None, bool, int, float, str and lists / str-keyed maps of them,
and each tensor's ``dtype``/``shape`` and raw little-endian bytes are exactly the array
encoding of ``wire`` (``encode_array``/``decode_array``), stored out of line so tensors
stream to and from disk without a second in-memory copy. A tensor may also be given as a
:class:`ChunkedTensor` (e.g. a replay snapshot's column): its chunks are written as they come.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import struct
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgpack
import numpy as np
import torch
from torch import Tensor

from actorlearner import wire

logger = logging.getLogger(__name__)

MAGIC = b"ALCKPT1\n"
"""First bytes of every part file: format name and version."""

FORMAT_VERSION = 1
"""Version of the manifest and part layout."""

MANIFEST = "manifest.json"
PART_SUFFIX = ".part"
MAX_HEADER_BYTES = 64 * 2**20
"""Cap on a part's msgpack header (names, shapes and plain values; tensors live outside)."""

_LENGTH = struct.Struct("<Q")
_CKPT_RE = re.compile(r"ckpt-(\d{12,})")
_PART_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_READ_CHUNK = 1 << 20

PartState = Mapping[str, Any]
"""A part: name -> tensor, chunked tensor or plain value (None, bool, int, float, str, lists, str-keyed maps)."""


@runtime_checkable
class ChunkedTensor(Protocol):
    """A tensor of ``dtype`` and ``shape`` (at least 1-d) produced piecewise, e.g. because it is
    too big, or too much in use, to copy whole: ``chunks()`` yields consecutive slices along
    dim 0 that together make ``shape``."""

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    def chunks(self) -> Iterator[Tensor]: ...


class CheckpointError(Exception):
    """A checkpoint or part file that cannot be used; the message says why."""


# --------------------------------------------------------------------------- part files


def _plain(value: Any, where: str) -> Any:
    """``value`` as msgpack-safe plain data, or TypeError naming ``where``."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: map keys must be strings")
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"{where}: cannot checkpoint a {type(value).__name__}")


def _checked_plain(value: Any, where: str) -> Any:
    """Validate a decoded header value (rejects msgpack extension types)."""
    try:
        return _plain(value, where)
    except TypeError as e:
        raise CheckpointError(str(e)) from None


def _wire_dtype(tensor: Tensor | ChunkedTensor, where: str) -> str:
    """The wire dtype name of ``tensor`` (torch.float32 -> "float32"), if it is allowed."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in wire.DTYPES:
        raise TypeError(f"{where}: dtype {tensor.dtype} cannot be checkpointed")
    return name


def _pieces(key: str, tensor: Tensor | ChunkedTensor) -> Iterator[Tensor]:
    """The tensor itself, or a chunked tensor's chunks checked to add up to its dtype and shape."""
    if isinstance(tensor, Tensor):
        yield tensor
        return
    shape, rows = tuple(tensor.shape), 0
    for chunk in tensor.chunks():
        if chunk.dtype != tensor.dtype or tuple(chunk.shape[1:]) != shape[1:]:
            raise ValueError(f"{key}: a chunk of {chunk.dtype} {tuple(chunk.shape)} does not fit {tensor.dtype} {shape}")
        rows += chunk.shape[0]
        yield chunk
    if rows != shape[0]:
        raise ValueError(f"{key}: chunks hold {rows} rows, the shape says {shape[0]}")


def write_part(path: str | os.PathLike[str], state: PartState) -> tuple[int, str]:
    """Write ``state`` to a new file at ``path`` and fsync it; returns (bytes, sha256 hex).

    Tensors are written one at a time straight from their memory (CUDA tensors are
    copied to the host one at a time; chunked tensors one chunk at a time), so nothing
    large is held twice.
    """
    values: dict[str, Any] = {}
    tensors: list[tuple[str, Tensor | ChunkedTensor]] = []
    entries: list[dict[str, Any]] = []
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"part keys must be strings, got {key!r}")
        if isinstance(value, (Tensor, ChunkedTensor)):
            entries.append({"name": key, "dtype": _wire_dtype(value, key), "shape": list(value.shape)})
            tensors.append((key, value))
        else:
            values[key] = _plain(value, key)
    header = msgpack.packb({"values": values, "tensors": entries}, use_bin_type=True)
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"part header is {len(header)} bytes, over {MAX_HEADER_BYTES}; "
                         "store large data as tensors")
    digest = hashlib.sha256()
    with open(path, "xb") as f:
        for chunk in (MAGIC, _LENGTH.pack(len(header)), header):
            f.write(chunk)
            digest.update(chunk)
        for key, tensor in tensors:
            for piece in _pieces(key, tensor):
                data = wire.encode_array(piece.detach().cpu().contiguous().numpy())["data"]
                f.write(data)
                digest.update(data)
                del data
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    return size, digest.hexdigest()


def _tensor_nbytes(entry: Any, max_bytes: int | None) -> int:
    """Byte length of a header tensor entry, validated before anything is allocated."""
    if not isinstance(entry, dict) or entry.keys() != {"name", "dtype", "shape"}:
        raise CheckpointError(f"malformed tensor entry {entry!r:.200}")
    name, dtype, shape = entry["name"], entry["dtype"], entry["shape"]
    if not isinstance(name, str) or dtype not in wire.DTYPES:
        raise CheckpointError(f"tensor {name!r:.100} has an unknown dtype {dtype!r:.50}")
    if (not isinstance(shape, list) or len(shape) > wire.MAX_RANK
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise CheckpointError(f"tensor {name!r} has an invalid shape {shape!r:.200}")
    nbytes = math.prod(shape) * wire.DTYPES[dtype].itemsize
    if max_bytes is not None and nbytes > max_bytes:
        raise CheckpointError(f"tensor {name!r} is {nbytes} bytes, over the cap of {max_bytes}")
    return nbytes


def read_part(path: str | os.PathLike[str], max_bytes: int | None = None) -> tuple[dict[str, Any], str]:
    """A part file's state (writable CPU tensors and plain values) and the file's sha256 hex.

    Every length is checked against the file size before allocating, and tensor bytes
    are read straight into their final buffer. ``max_bytes`` optionally caps each tensor.
    Anything malformed (bad magic, e.g. a pickle; truncation; trailing bytes) raises
    CheckpointError.
    """
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        remaining = os.fstat(f.fileno()).st_size

        def take(n: int, what: str) -> bytes:
            nonlocal remaining
            if n > remaining:
                raise CheckpointError(f"{path.name} is truncated in its {what}")
            data = f.read(n)
            if len(data) != n:
                raise CheckpointError(f"{path.name} is truncated in its {what}")
            remaining -= n
            digest.update(data)
            return data

        if take(len(MAGIC), "magic") != MAGIC:
            raise CheckpointError(f"{path.name} is not an actorlearner part file (bad magic)")
        (header_len,) = _LENGTH.unpack(take(_LENGTH.size, "header length"))
        if header_len > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path.name} declares a {header_len}-byte header, over the cap")
        try:
            header = msgpack.unpackb(take(header_len, "header"), raw=False, strict_map_key=True)
        except CheckpointError:
            raise
        except Exception as e:  # msgpack raises many types on garbage.
            raise CheckpointError(f"{path.name} has an invalid header: {type(e).__name__}: {e}"[:300]) from None
        if not isinstance(header, dict) or header.keys() != {"values", "tensors"}:
            raise CheckpointError(f"{path.name} has an invalid header")
        values, entries = header["values"], header["tensors"]
        if not isinstance(values, dict) or not isinstance(entries, list):
            raise CheckpointError(f"{path.name} has an invalid header")
        out: dict[str, Any] = {k: _checked_plain(v, k) for k, v in values.items()}
        for entry in entries:
            nbytes = _tensor_nbytes(entry, max_bytes)
            name = entry["name"]
            if name in out:
                raise CheckpointError(f"{path.name} holds {name!r} twice")
            if nbytes > remaining:
                raise CheckpointError(f"{path.name} is truncated in tensor {name!r}")
            buffer = bytearray(nbytes)
            view = memoryview(buffer)
            filled = 0
            while filled < nbytes:
                n = f.readinto(view[filled:])
                if not n:
                    raise CheckpointError(f"{path.name} is truncated in tensor {name!r}")
                filled += n
            remaining -= nbytes
            digest.update(view)
            del view
            try:
                array = wire.decode_array(
                    {"dtype": entry["dtype"], "shape": entry["shape"], "data": buffer},
                    max_bytes=sys.maxsize, writable=True,  # Sizes were checked above.
                )
            except wire.WireError as e:
                raise CheckpointError(f"{path.name}: tensor {name!r}: {e}") from None
            out[name] = torch.from_numpy(array)
        if remaining:
            raise CheckpointError(f"{path.name} has {remaining} unexpected trailing bytes")
    return out, digest.hexdigest()


# --------------------------------------------------------------------------- directories


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoint_dirs(parent: Path) -> list[tuple[int, Path]]:
    """``(number, path)`` of every ``ckpt-<n>`` directory under ``parent``, oldest first."""
    if not parent.is_dir():
        return []
    found = []
    for entry in parent.iterdir():
        match = _CKPT_RE.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _write_checkpoint(final: Path, parts: Mapping[str, PartState], meta: dict[str, Any]) -> Path:
    """Write ``parts`` and a manifest into a temp dir, fsync, then rename it to ``final``."""
    for name in parts:
        if not isinstance(name, str) or not _PART_NAME_RE.fullmatch(name):
            raise ValueError(f"invalid part name {name!r}: use letters, digits, '_', '.', '-'")
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temp = final.parent / f".tmp-{final.name}-{token}"
    trash = final.parent / f".trash-{final.name}-{token}"
    temp.mkdir(parents=True)
    try:
        files = {}
        for name, state in parts.items():
            filename = name + PART_SUFFIX
            size, sha256 = write_part(temp / filename, state)
            files[name] = {"file": filename, "bytes": size, "sha256": sha256}
        manifest = {"format": FORMAT_VERSION, **meta, "created_unix": time.time(), "parts": files}
        with open(temp / MANIFEST, "x", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(temp)
        if final.exists():  # Same step saved again: swap the old one out, then drop it.
            final.rename(trash)
        temp.rename(final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        if trash.exists() and not final.exists():
            trash.rename(final)
        raise
    shutil.rmtree(trash, ignore_errors=True)
    return final


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint directory ``path``, structurally checked."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError("manifest.json is missing (incomplete checkpoint)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"manifest.json is unreadable: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"manifest.json has an unknown format "
                              f"{manifest.get('format') if isinstance(manifest, dict) else None!r}")
    parts = manifest.get("parts")
    if not isinstance(parts, dict):
        raise CheckpointError("manifest.json lists no parts")
    for name, info in parts.items():
        if (not _PART_NAME_RE.fullmatch(name) or not isinstance(info, dict)
                or info.get("file") != name + PART_SUFFIX
                or type(info.get("bytes")) is not int or not isinstance(info.get("sha256"), str)):
            raise CheckpointError(f"manifest.json has an invalid entry for part {name!r:.100}")
    return manifest


def _load_checkpoint(path: Path, max_bytes: int | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(manifest, parts) of checkpoint ``path``, every file's size and sha256 verified."""
    manifest = _read_manifest(path)
    files = manifest["parts"]
    for name, info in files.items():  # Cheap size check of every file before reading any.
        try:
            size = (path / info["file"]).stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"part file {info['file']} is missing") from None
        if size != info["bytes"]:
            raise CheckpointError(f"part file {info['file']} is {size} bytes, manifest says "
                                  f"{info['bytes']} (truncated or overwritten)")
    parts = {}
    for name, info in files.items():
        state, sha256 = read_part(path / info["file"], max_bytes)
        if sha256 != info["sha256"]:
            raise CheckpointError(f"part file {info['file']} fails its sha256 checksum")
        parts[name] = state
    return manifest, parts


class CheckpointStore:
    """Numbered checkpoints under ``directory`` (the last ``keep`` kept) and a ``best/`` slot.

    One writer per directory: temp directories left by a crash are removed on open.
    ``max_part_bytes`` optionally caps each stored tensor; by default only the file size
    bounds what is allocated, so a 1M-item replay buffer loads.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3, *,
                 max_part_bytes: int | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.best_directory = self.directory / "best"
        self.keep = keep
        self.max_part_bytes = max_part_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._best_score: float | None = None
        self._best_known = False
        self._unusable: list[Path] = []  # skipped by load_latest; moved aside by the next save
        for parent in (self.directory, self.best_directory):
            if parent.is_dir():
                for entry in parent.iterdir():
                    original = parent / entry.name.removeprefix(".trash-").rsplit("-", 2)[0]
                    if entry.name.startswith(".trash-") and not original.exists():
                        entry.rename(original)  # Crashed mid-swap: the old copy is all there is.
                    elif entry.name.startswith((".tmp-", ".trash-")):
                        shutil.rmtree(entry, ignore_errors=True)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every checkpoint directory, oldest first, valid or not."""
        return _checkpoint_dirs(self.directory)

    def save(self, step: int, parts: Mapping[str, PartState]) -> Path:
        """Durably write checkpoint ``step`` (one file per part), then prune to the last ``keep``."""
        if type(step) is not int or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        path = _write_checkpoint(self.directory / f"ckpt-{step:012d}", parts, {"step": step})
        # Left in place, a broken checkpoint numbered above this one would count among the
        # newest and pruning would delete good ones instead; keep it for a look.
        for broken in self._unusable:
            if broken != path and broken.exists():
                aside = broken.with_name(broken.name + ".broken")
                shutil.rmtree(aside, ignore_errors=True)
                broken.rename(aside)
                logger.warning("moved unusable checkpoint %s aside to %s", broken, aside.name)
        self._unusable.clear()
        for _, old in self.checkpoints()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def load(self, path: str | os.PathLike[str]) -> tuple[int, dict[str, dict[str, Any]]]:
        """``(step, parts)`` of one checkpoint directory; CheckpointError if it is unusable."""
        path = Path(path)
        manifest, parts = _load_checkpoint(path, self.max_part_bytes)
        match = _CKPT_RE.fullmatch(path.name)
        if match is None or manifest.get("step") != int(match.group(1)):
            raise CheckpointError(f"manifest step {manifest.get('step')!r} does not match {path.name}")
        return manifest["step"], parts

    def load_latest(self) -> tuple[int, dict[str, dict[str, Any]]] | None:
        """The newest usable checkpoint as ``(step, parts)``; broken ones are skipped with a warning."""
        for _, path in reversed(self.checkpoints()):
            try:
                return self.load(path)
            except (CheckpointError, OSError) as e:
                logger.warning("skipping checkpoint %s: %s", path, e)
                self._unusable.append(path)
        return None

    # -- best ------------------------------------------------------------------------------

    @property
    def best_score(self) -> float | None:
        """Score of the stored best policy, or None when there is none."""
        if not self._best_known:
            best = self.load_best()
            self._best_score = None if best is None else best[0]
            self._best_known = True
        return self._best_score

    def save_best(self, parts: Mapping[str, PartState], score: float, *, step: int | None = None) -> bool:
        """Keep ``parts`` under ``best/`` if ``score`` beats the stored best; True if it did."""
        score = float(score)
        if not math.isfinite(score):
            raise ValueError(f"score must be finite, got {score}")
        current = self.best_score
        if current is not None and score <= current:
            return False
        existing = _checkpoint_dirs(self.best_directory)
        number = existing[-1][0] + 1 if existing else 0
        self.best_directory.mkdir(exist_ok=True)
        _write_checkpoint(self.best_directory / f"ckpt-{number:012d}", parts,
                          {"score": score, "step": step})
        for _, old in existing:
            shutil.rmtree(old, ignore_errors=True)
        self._best_score, self._best_known = score, True
        return True

    def load_best(self) -> tuple[float, dict[str, dict[str, Any]]] | None:
        """``(score, parts)`` of the best policy, or None; broken ones are skipped with a warning."""
        for _, path in reversed(_checkpoint_dirs(self.best_directory)):
            try:
                manifest, parts = _load_checkpoint(path, self.max_part_bytes)
                score = manifest.get("score")
                if not isinstance(score, (int, float)) or isinstance(score, bool):
                    raise CheckpointError(f"manifest score {score!r} is not a number")
                return float(score), parts
            except (CheckpointError, OSError) as e:
                logger.warning("skipping best checkpoint %s: %s", path, e)
        return None


def read_checkpoint(path: str | os.PathLike[str]) -> tuple[Path, dict[str, dict[str, Any]]]:
    """``(checkpoint directory, parts)`` for ``path``: one checkpoint (``ckpt-*``), or the newest usable
    one in a checkpoint directory. Read only: nothing there is moved or removed, so a learner may
    be writing to it meanwhile. CheckpointError when there is none."""
    path = Path(path)
    candidates = [path] if (path / "manifest.json").exists() else [p for _, p in reversed(_checkpoint_dirs(path))]
    problems = []
    for candidate in candidates:
        try:
            return candidate, _load_checkpoint(candidate, None)[1]
        except (CheckpointError, OSError) as e:
            problems.append(f"{candidate.name}: {e}")
    raise CheckpointError(f"no usable checkpoint in {path}" + (f" ({'; '.join(problems)})" if problems else ""))


# --------------------------------------------------------------------------- RNG states


def rng_state(device: torch.device) -> dict[str, Any]:
    """The process-wide torch (CPU, and ``device`` if CUDA), numpy and ``random`` generators as a part."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_words, py_gauss = random.getstate()
    state = {"torch.cpu": torch.get_rng_state(), "numpy.kind": np_kind,
             "numpy.keys": torch.from_numpy(np_keys.astype(np.uint32)), "numpy.pos": int(np_pos),
             "numpy.has_gauss": int(np_has_gauss), "numpy.cached_gaussian": float(np_gauss),
             "python.version": py_version, "python.words": torch.tensor(py_words, dtype=torch.int64),
             "python.gauss_next": py_gauss}
    if device.type == "cuda":
        state["torch.cuda"] = torch.cuda.get_rng_state(device)
    return state


def load_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Restore generators saved by :func:`rng_state`; a CUDA state only onto a CUDA ``device``."""
    torch.set_rng_state(state["torch.cpu"])
    if "torch.cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["torch.cuda"], device)
    np.random.set_state((state["numpy.kind"], state["numpy.keys"].numpy(), state["numpy.pos"],
                         state["numpy.has_gauss"], state["numpy.cached_gaussian"]))
    random.setstate((state["python.version"], tuple(state["python.words"].tolist()), state["python.gauss_next"]))
