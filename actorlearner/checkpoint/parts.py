"""The part file: one checkpoint part (plain values and tensors) in the project's own format; never pickle.

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
import math
import os
import struct
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgpack
import numpy as np
import torch
from torch import Tensor

from actorlearner import wire

MAGIC = b"ALCKPT1\n"
"""First bytes of every part file: format name and version."""

MAX_HEADER_BYTES = 64 * 2**20
"""Cap on a part's msgpack header (names, shapes and plain values; tensors live outside)."""

_LENGTH = struct.Struct("<Q")

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
