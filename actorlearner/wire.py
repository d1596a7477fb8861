"""Bytes <-> arrays for everything that crosses a process boundary; the only such place.

Arrays travel as msgpack maps ``{"dtype": str, "shape": [int, ...], "data": bin}`` with
raw little-endian data (see ``Codec`` in proto/actorlearner/v1/learner.proto). Nothing
here pickles, ``torch.load``s or evals: every input is checked (dtype whitelist, shape,
byte length, size caps before allocating, finite floats) and every rejection is a
``WireError`` whose ``code`` names the gRPC status to answer with.
"""

from __future__ import annotations

import enum
import itertools
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np
import torch

from actorlearner.v1 import learner_pb2 as pb

PROTOCOL_VERSION = 1
"""Version of the actor <-> learner protocol (``Hello.protocol_version``)."""

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
_TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.uint16: "uint16",
    torch.int16: "int16", torch.uint32: "uint32", torch.int32: "int32",
    torch.uint64: "uint64", torch.int64: "int64", torch.float16: "float16", torch.float32: "float32",
    torch.float64: "float64",
}

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


class Codec(enum.IntEnum):
    """Payload codecs; values and names (with ``CODEC_``) match ``actorlearner.v1.Codec``."""

    UNSPECIFIED = 0
    MSGPACK = 1
    MSGPACK_ZLIB = 2

    @property
    def label(self) -> str:
        """Short name for configs and flags: ``msgpack`` or ``msgpack+zlib``."""
        return self.name.lower().replace("_", "+")

    @classmethod
    def parse(cls, value: Codec | int | str) -> Codec:
        """A usable codec from an enum, proto value or name; UNSPECIFIED is rejected."""
        try:
            if isinstance(value, str):
                key = value.strip().upper().removeprefix("CODEC_").replace("+", "_")
                codec = cls[key]
            else:
                codec = cls(int(value))
        except (KeyError, ValueError, TypeError, OverflowError):
            raise WireError(f"unknown codec {value!r}") from None
        if codec is cls.UNSPECIFIED:
            raise WireError("codec is unspecified")
        return codec


# --------------------------------------------------------------------------- arrays


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


def _unpack(payload: Buffer, max_bytes: int, what: str, max_entries: int | None = None) -> Any:
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


def _decompress(payload: Buffer, codec: Codec, max_bytes: int) -> Buffer:
    """The msgpack bytes of ``payload``; zlib output is capped at ``max_bytes`` (no bombs)."""
    if codec is Codec.MSGPACK:
        return payload
    if len(payload) > max_bytes:
        raise WireError(
            f"payload is {len(payload)} bytes, over the cap of {max_bytes}", "RESOURCE_EXHAUSTED"
        )
    inflater = zlib.decompressobj()
    try:  # max_length is max_bytes + 1 (0 would mean unlimited); longer output is a bomb.
        raw = inflater.decompress(payload, max_bytes + 1)
    except zlib.error as e:
        raise WireError(f"payload is not valid zlib data: {e}") from None
    if len(raw) > max_bytes or inflater.unconsumed_tail:
        raise WireError(
            f"decompressed payload exceeds the cap of {max_bytes} bytes", "RESOURCE_EXHAUSTED"
        )
    if not inflater.eof:
        raise WireError("zlib payload is truncated")
    if inflater.unused_data:
        raise WireError("zlib payload has trailing bytes")
    return raw


def _field_names(names: Sequence[str]) -> str:
    return ", ".join(sorted(map(str, names)))


def _check_keys(got: Mapping[str, Any], want: Mapping[str, Any], what: str, code: str) -> None:
    """Raise naming the missing and unknown keys unless ``got`` has exactly ``want``'s."""
    missing = [k for k in want if k not in got]
    unknown = [k for k in got if k not in want]
    if missing or unknown:
        parts = [f"missing {what}s: {_field_names(missing)}"] if missing else []
        parts += [f"unknown {what}s: {_field_names(unknown)}"] if unknown else []
        raise WireError("; ".join(parts), code)


def np_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a numpy dtype, torch dtype or wire name."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_DTYPES:
            raise WireError(f"torch dtype {dtype} is not allowed on the wire")
        return np.dtype(_TORCH_DTYPES[dtype])
    return np.dtype(dtype)


# --------------------------------------------------------------------------- batches


def encode_batch(
    fields: Mapping[str, np.ndarray], codec: Codec | int | str = Codec.MSGPACK, level: int = 1
) -> bytes:
    """A TrajectoryBatch payload: a msgpack map of field name -> array, maybe zlib'd."""
    codec = Codec.parse(codec)
    raw = msgpack.packb({str(k): encode_array(v) for k, v in fields.items()}, use_bin_type=True)
    return zlib.compress(raw, level) if codec is Codec.MSGPACK_ZLIB else raw


def decode_batch(
    payload: Buffer,
    codec: Codec | int | str,
    spec: Spec,
    num_transitions: int,
    max_bytes: int = DEFAULT_MAX_BYTES,
    *,
    writable: bool = False,
) -> dict[str, np.ndarray]:
    """Fields of a TrajectoryBatch payload, exactly as ``spec`` says, each ``(n, *shape)``.

    Arrays are read-only views over the decoded payload unless ``writable``; floats are
    finite. Anything else raises WireError (INVALID_ARGUMENT or RESOURCE_EXHAUSTED).
    """
    codec = Codec.parse(codec)
    if type(num_transitions) is not int or num_transitions < 1:
        raise WireError(f"num_transitions must be a positive int, got {num_transitions!r}")
    # A few entries of slack so that extra fields are still named as such by _check_keys.
    obj = _unpack(_decompress(payload, codec, max_bytes), max_bytes, "batch payload", len(spec) + 8)
    if not isinstance(obj, dict):
        raise WireError(f"batch payload must be a map of fields, got {type(obj).__name__}")
    _check_keys(obj, spec, "field", "INVALID_ARGUMENT")
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in spec.items():
        try:
            array = decode_array(obj[name], max_bytes, writable=writable)
        except WireError as e:
            raise WireError(f"field {name!r}: {e}", e.code) from None
        want_dtype, want_shape = np_dtype(dtype), (num_transitions, *map(int, shape))
        if array.dtype != want_dtype:
            raise WireError(f"field {name!r} has dtype {array.dtype}, expected {want_dtype}")
        if array.shape != want_shape:
            raise WireError(f"field {name!r} has shape {array.shape}, expected {want_shape}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = "NaN" if np.isnan(array).any() else "inf"
            raise WireError(f"field {name!r} contains {bad}")
        out[name] = array
    return out


def decode_priorities(priorities: Sequence[float], num_transitions: int) -> np.ndarray | None:
    """Actor priorities as float32, or None when empty; finite, >= 0, one per transition."""
    if len(priorities) == 0:
        return None
    array = np.asarray(priorities, dtype=np.float32)
    if array.shape != (num_transitions,):
        raise WireError(f"{len(array)} priorities for {num_transitions} transitions")
    if not np.isfinite(array).all() or (array < 0).any():
        raise WireError("priorities must be finite and non-negative")
    return array


# --------------------------------------------------------------------------- weights


def encode_state_dict(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """A policy state dict as one msgpack map of parameter name -> array (CODEC_MSGPACK)."""
    arrays: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        if tensor.dtype not in _TORCH_DTYPES:
            raise WireError(f"tensor {name!r} has dtype {tensor.dtype}, not allowed on the wire")
        arrays[str(name)] = encode_array(tensor.detach().cpu().contiguous().numpy())
    return msgpack.packb(arrays, use_bin_type=True)


def decode_state_dict(
    payload: Buffer,
    max_bytes: int = DEFAULT_MAX_BYTES,
    expected: Spec | None = None,
) -> dict[str, torch.Tensor]:
    """Writable CPU tensors from an encoded state dict, matching ``expected`` exactly if given.

    A mismatch with ``expected`` (the local model) raises WireError(FAILED_PRECONDITION).
    """
    # Without ``expected``, a parameter takes at least 16 bytes of a well-formed payload.
    entries = len(expected) + 8 if expected is not None else len(payload) // 16 + 1
    obj = _unpack(payload, max_bytes, "state dict payload", entries)
    if not isinstance(obj, dict):
        raise WireError(f"state dict payload must be a map, got {type(obj).__name__}")
    if not all(isinstance(k, str) for k in obj):
        raise WireError("state dict parameter names must be strings")
    if expected is not None:
        _check_keys(obj, expected, "parameter", "FAILED_PRECONDITION")
    out: dict[str, torch.Tensor] = {}
    for name in expected if expected is not None else obj:
        try:
            array = decode_array(obj[name], max_bytes, writable=True)
        except WireError as e:
            raise WireError(f"parameter {name!r}: {e}", e.code) from None
        if expected is not None:
            shape, dtype = expected[name]
            want_shape, want_dtype = tuple(map(int, shape)), np_dtype(dtype)
            if array.shape != want_shape or array.dtype != want_dtype:
                raise WireError(
                    f"parameter {name!r} is {array.dtype}{list(array.shape)}, "
                    f"expected {want_dtype}{list(want_shape)}",
                    "FAILED_PRECONDITION",
                )
        out[name] = torch.from_numpy(array)
    return out


def state_dict_spec(
    state_dict: Mapping[str, torch.Tensor],
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The ``expected`` argument of decode_state_dict for a local model's state dict."""
    return {k: (tuple(v.shape), v.dtype) for k, v in state_dict.items()}


# --------------------------------------------------------------------------- chunks


def split_chunks(payload: Buffer, chunk_bytes: int) -> list[bytes]:
    """``payload`` cut into PolicyUpdate-sized pieces; always at least one (maybe empty)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    view = memoryview(payload).cast("B")
    if len(view) == 0:
        return [b""]
    return [bytes(view[i : i + chunk_bytes]) for i in range(0, len(view), chunk_bytes)]


class ChunkAssembler:
    """Reassembles chunked PolicyUpdates of one stream; latest version wins.

    Chunks of a version must arrive in order (index 0, 1, ...) with a constant count and
    total. A chunk of a newer version drops an incomplete older one; chunks of a version
    older than the newest seen are ignored. Protocol violations raise WireError.
    """

    def __init__(self, max_total_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_total_bytes = max_total_bytes
        self.latest_version: int | None = None
        self.dropped_versions = 0
        self._reset()

    def _reset(self) -> None:
        self._version: int | None = None
        self._count = self._total = self._received = 0
        self._parts: list[bytes] = []

    def add(
        self, version: int, chunk_index: int, chunk_count: int, total_bytes: int, payload: bytes
    ) -> bytes | None:
        """Take one chunk; the whole payload when it completes a version, else None."""
        try:
            return self._add(version, chunk_index, chunk_count, total_bytes, payload)
        except WireError:
            self._reset()  # A broken version is dropped whole; the next one starts clean.
            raise

    def _add(
        self, version: int, chunk_index: int, chunk_count: int, total_bytes: int, payload: bytes
    ) -> bytes | None:
        if self.latest_version is not None and version < self.latest_version:
            return None
        if total_bytes > self.max_total_bytes:
            raise WireError(
                f"policy version {version} is {total_bytes} bytes, over the cap of "
                f"{self.max_total_bytes}",
                "RESOURCE_EXHAUSTED",
            )
        if chunk_count < 1 or chunk_count > max(1, total_bytes):
            raise WireError(f"chunk_count {chunk_count} is invalid for {total_bytes} bytes")
        if not 0 <= chunk_index < chunk_count:
            raise WireError(f"chunk_index {chunk_index} is out of range [0, {chunk_count})")
        if self._version != version:
            if self._version is not None:
                self.dropped_versions += 1
            self._reset()
            if chunk_index != 0:
                raise WireError(f"policy version {version} starts at chunk {chunk_index}, not 0")
            self._version, self._count, self._total = version, chunk_count, total_bytes
            self.latest_version = version
        elif (chunk_count, total_bytes) != (self._count, self._total):
            raise WireError(
                f"policy version {version} changed chunk_count/total_bytes from "
                f"{self._count}/{self._total} to {chunk_count}/{total_bytes}"
            )
        elif chunk_index != len(self._parts):
            raise WireError(
                f"policy version {version}: chunk {chunk_index} arrived, expected {len(self._parts)}"
            )
        self._received += len(payload)
        if self._received > total_bytes:
            raise WireError(f"policy version {version} chunks exceed total_bytes {total_bytes}")
        self._parts.append(payload)
        if chunk_index + 1 < chunk_count:
            return None
        if self._received != total_bytes:
            raise WireError(
                f"policy version {version} chunks add up to {self._received}, not {total_bytes}"
            )
        whole = b"".join(self._parts)
        self._reset()
        return whole


def encode_batch_message(seq: int, policy_version: int, num_transitions: int, payload: bytes,
                         codec: Codec | int | str, priorities: Sequence[float] = (),
                         games: Sequence[pb.GameResult] = (), opponents: Sequence[str] = ()) -> bytes:
    """A serialized ``ActorMessage{batch}`` that copies the payload once.

    Building the proto objects would copy a large payload into the batch, again into the
    message, and again when serializing. Protobuf lets fields come in any order, so the
    small fields are serialized normally and the payload field is appended as raw bytes.
    """
    head = pb.TrajectoryBatch(seq=seq, policy_version=policy_version, num_transitions=num_transitions,
                              codec=int(Codec.parse(codec)), priorities=priorities, games=games,
                              opponents=opponents).SerializeToString()
    payload_key = _field_key(pb.TrajectoryBatch, "payload") + _varint(len(payload))
    inner = len(head) + len(payload_key) + len(payload)
    return b"".join((_field_key(pb.ActorMessage, "batch"), _varint(inner), head, payload_key, payload))


def _field_key(message_class, field: str) -> bytes:
    """The protobuf key of a length-delimited field (wire type 2)."""
    return _varint(message_class.DESCRIPTOR.fields_by_name[field].number << 3 | 2)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
