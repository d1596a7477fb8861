"""Arrays <-> msgpack maps ``{"dtype", "shape", "data"}``, and the checks every wire input passes.

Arrays travel with raw little-endian data (see ``Codec`` in proto/actorlearner/v1/learner.proto).
Nothing here pickles, ``torch.load``s or evals: every input is checked (dtype whitelist, shape,
byte length, size caps before allocating) and every rejection is a ``WireError`` whose ``code``
names the gRPC status to answer with.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

DEFAULT_MAX_BYTES = 256 * 2**20
"""Default cap on any one payload, compressed or decompressed, and on assembled weights."""

MAX_RANK = 16
"""Most dimensions an array may have on the wire."""

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
        "float16", "float32", "float64",
    )
}
"""The dtype whitelist: wire name -> little-endian numpy dtype."""

_ARRAY_KEYS = frozenset(("dtype", "shape", "data"))

Buffer = bytes | bytearray | memoryview

Spec = Mapping[str, tuple[Sequence[int], Any]]
"""Field name -> (shape, dtype); dtype as numpy dtype, torch dtype or wire name."""


class WireError(ValueError):
    """Rejected wire input; ``code`` names the ``grpc.StatusCode`` to answer with."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.code = code

    @property
    def status_code(self) -> Any:
        """The ``grpc.StatusCode`` member named by ``code``."""
        import grpc

        return grpc.StatusCode[self.code]


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """The wire map of ``array``; its data is a zero-copy view when already C-ordered LE."""
    array = np.asarray(array)
    name = array.dtype.name
    if name not in DTYPES or array.dtype.fields is not None:
        raise WireError(f"dtype {array.dtype} is not allowed on the wire")
    array = array.astype(DTYPES[name], copy=False)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    data = array.reshape(-1).view(np.uint8).data
    return {"dtype": name, "shape": list(array.shape), "data": data}


def decode_array(
    obj: Any, max_bytes: int = DEFAULT_MAX_BYTES, *, writable: bool = False
) -> np.ndarray:
    """An array from its wire map, checked before allocating; read-only unless ``writable``."""
    if not isinstance(obj, dict):
        raise WireError(f"array must be a map, got {type(obj).__name__}")
    if obj.keys() != _ARRAY_KEYS:
        got = sorted(map(str, obj))
        raise WireError(f"array map must have keys {sorted(_ARRAY_KEYS)}, got {got}")
    name, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if not isinstance(name, str) or name not in DTYPES:
        raise WireError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}")
    dtype = DTYPES[name]
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        raise WireError(f"shape must be a list of ints, got {shape!r:.100}")
    if len(shape) > MAX_RANK:
        raise WireError(f"rank {len(shape)} exceeds the cap of {MAX_RANK}")
    if any(d < 0 for d in shape):
        raise WireError(f"negative dimension in shape {shape}")
    if any(d > max_bytes for d in shape):
        raise WireError(f"dimension in shape {shape} exceeds the cap", "RESOURCE_EXHAUSTED")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > max_bytes:
        raise WireError(
            f"array of shape {shape} {name} is {nbytes} bytes, over the cap of {max_bytes}",
            "RESOURCE_EXHAUSTED",
        )
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"array data must be binary, got {type(data).__name__}")
    if len(data) != nbytes:
        raise WireError(f"array of shape {shape} {name} needs {nbytes} bytes, got {len(data)}")
    if name == "bool" and nbytes and np.frombuffer(data, np.uint8).max() > 1:
        raise WireError("bool array holds bytes other than 0 and 1")
    try:
        array = np.frombuffer(data, dtype).reshape(shape)
    except (ValueError, OverflowError) as e:
        raise WireError(f"cannot shape array as {shape}: {e}") from None
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array.copy() if writable and not array.flags.writeable else array


def unpack(payload: Buffer, max_bytes: int, what: str, max_entries: int | None = None) -> Any:
    """Msgpack-decode ``payload`` with size caps, mapping every failure to WireError.

    Bytes are not the whole cost: an empty map is one byte on the wire and ~80 in Python.
    So arrays hold at most MAX_RANK items (shapes are the only arrays), and with
    ``max_entries`` (fields or parameters) maps hold at most that many entries and the
    decode stops at the first map or array past ``2 * max_entries + 1`` (the top map, and
    per entry its array map and shape): memory stays proportional to the expected layout.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise WireError(f"{what} must be bytes, got {type(payload).__name__}")
    if len(payload) > max_bytes:
        raise WireError(
            f"{what} is {len(payload)} bytes, over the cap of {max_bytes}", "RESOURCE_EXHAUSTED"
        )
    limits: dict[str, Any] = {"max_array_len": MAX_RANK}
    if max_entries is not None:
        max_containers, counter = 2 * max_entries + 1, itertools.count(1)

        def count(container: Any) -> Any:
            if next(counter) > max_containers:
                raise WireError(f"{what} holds more than {max_containers} maps and arrays")
            return container

        limits.update(max_map_len=max(max_entries, len(_ARRAY_KEYS)), object_hook=count, list_hook=count)
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True, **limits)
    except WireError:
        raise
    except Exception as e:  # msgpack raises many types on garbage; all mean bad input.
        raise WireError(f"{what} is not valid msgpack: {type(e).__name__}: {e}"[:300]) from None


def _field_names(names: Sequence[str]) -> str:
    return ", ".join(sorted(map(str, names)))


def check_keys(got: Mapping[str, Any], want: Mapping[str, Any], what: str, code: str) -> None:
    """Raise naming the missing and unknown keys unless ``got`` has exactly ``want``'s."""
    missing = [k for k in want if k not in got]
    unknown = [k for k in got if k not in want]
    if missing or unknown:
        parts = [f"missing {what}s: {_field_names(missing)}"] if missing else []
        parts += [f"unknown {what}s: {_field_names(unknown)}"] if unknown else []
        raise WireError("; ".join(parts), code)


def np_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a numpy dtype, torch dtype or wire name. A torch dtype is told by its type's module, so
    that this module (and the env processes that use it) never imports torch."""
    if type(dtype).__module__ == "torch":
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise WireError(f"torch dtype {dtype} is not allowed on the wire")
        return np.dtype(name)
    return np.dtype(dtype)


ZERO_COPY_MIN_BYTES = 1 << 16
"""Payloads at least this long are unpacked by :func:`unpack_array_maps` (views, no copies); shorter
ones by msgpack, faster there than a parse in Python."""

_INT_WIDTHS = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_LEN_WIDTHS = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4, 0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}


class _Unusual(Exception):
    """The payload is not in the common layout: msgpack decodes (or refuses) it instead."""


def unpack_array_maps(payload: Buffer, max_entries: int) -> dict[str, dict[str, Any]] | None:
    """A msgpack map of at most ``max_entries`` names to array maps, as :func:`unpack` returns it but
    with each array's ``data`` a view of ``payload``, not a copy; None for anything else (negative or
    duplicate entries, other types, trailing bytes), which :func:`unpack` then decodes or refuses."""
    view = memoryview(payload).cast("B")
    try:
        entries, at = _header(view, 0, 0x80, 0xDE, 0xDF)
        if entries > max_entries:
            return None
        out: dict[str, dict[str, Any]] = {}
        for _ in range(entries):
            name, at = _string(view, at)
            keys, at = _header(view, at, 0x80, 0xDE, 0xDF)
            if name in out or keys != len(_ARRAY_KEYS):
                return None
            array: dict[str, Any] = {}
            for _ in range(keys):
                key, at = _string(view, at)
                if key == "data":
                    size, at = _header(view, at, None, 0xC4, 0xC6)
                    if at + size > len(view):
                        return None
                    array[key], at = view[at:at + size], at + size
                elif key == "dtype":
                    array[key], at = _string(view, at)
                elif key == "shape":
                    rank, at = _header(view, at, 0x90, 0xDC, 0xDD)
                    if rank > MAX_RANK:
                        return None
                    array[key] = shape = []
                    for _ in range(rank):
                        dim, at = _uint(view, at)
                        shape.append(dim)
            if array.keys() != _ARRAY_KEYS:
                return None
            out[name] = array
        return out if at == len(view) else None
    except (_Unusual, IndexError, UnicodeDecodeError):
        return None


def _header(view: memoryview, at: int, fix: int | None, first: int, last: int) -> tuple[int, int]:
    """The length that a map, array, string or binary header at ``at`` gives, and where its body starts.
    ``fix`` is its family's 16 fixed-size tags' first (None: none), ``first``..``last`` its sized tags."""
    tag = view[at]
    if fix is not None and fix <= tag < fix + 16:
        return tag - fix, at + 1
    width = _LEN_WIDTHS.get(tag) if first <= tag <= last else None
    if width is None or at + 1 + width > len(view):
        raise _Unusual
    return int.from_bytes(view[at + 1:at + 1 + width], "big"), at + 1 + width


def _string(view: memoryview, at: int) -> tuple[str, int]:
    tag = view[at]
    if 0xA0 <= tag <= 0xBF:
        size, at = tag - 0xA0, at + 1
    else:
        size, at = _header(view, at, None, 0xD9, 0xDB)
    if at + size > len(view):
        raise _Unusual
    return bytes(view[at:at + size]).decode(), at + size


def _uint(view: memoryview, at: int) -> tuple[int, int]:
    tag = view[at]
    if tag <= 0x7F:
        return tag, at + 1
    width = _INT_WIDTHS.get(tag)
    if width is None or at + 1 + width > len(view):
        raise _Unusual
    return int.from_bytes(view[at + 1:at + 1 + width], "big"), at + 1 + width
