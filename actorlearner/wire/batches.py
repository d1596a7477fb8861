"""TrajectoryBatch payloads: codecs, fields checked against the spec, actor priorities, a one-copy ActorMessage."""

from __future__ import annotations

import enum
import zlib
from collections.abc import Mapping, Sequence

import msgpack
import numpy as np

from actorlearner.v1 import learner_pb2 as pb
from actorlearner.wire.arrays import (DEFAULT_MAX_BYTES, ZERO_COPY_MIN_BYTES, Buffer, Spec, WireError, check_keys,
                                      decode_array, encode_array, np_dtype, unpack, unpack_array_maps)

FRAMES = "frames"
"""The field of a frame-stacked batch that holds its frames, each once (``actorlearner.frames``)."""


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

    The one exception is :data:`FRAMES`, a frame-stacked batch's frames: ``(m, *shape)`` for any
    ``m >= 1``, referred to by index from the observation fields.

    Arrays are read-only views over the decoded payload unless ``writable``; floats are
    finite. Anything else raises WireError (INVALID_ARGUMENT or RESOURCE_EXHAUSTED).
    """
    codec = Codec.parse(codec)
    if type(num_transitions) is not int or num_transitions < 1:
        raise WireError(f"num_transitions must be a positive int, got {num_transitions!r}")
    raw = _decompress(payload, codec, max_bytes)
    # A few entries of slack so that extra fields are still named as such by _check_keys.
    obj = unpack_array_maps(raw, len(spec) + 8) if ZERO_COPY_MIN_BYTES <= len(raw) <= max_bytes else None
    if obj is None:
        obj = unpack(raw, max_bytes, "batch payload", len(spec) + 8)
    if not isinstance(obj, dict):
        raise WireError(f"batch payload must be a map of fields, got {type(obj).__name__}")
    check_keys(obj, spec, "field", "INVALID_ARGUMENT")
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in spec.items():
        try:
            array = decode_array(obj[name], max_bytes, writable=writable)
        except WireError as e:
            raise WireError(f"field {name!r}: {e}", e.code) from None
        rows = array.shape[0] if name == FRAMES and array.ndim and array.shape[0] else num_transitions
        want_dtype, want_shape = np_dtype(dtype), (rows, *map(int, shape))
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


def encode_batch_message(seq: int, policy_version: int, num_transitions: int, payload: bytes,
                         codec: Codec | int | str, priorities: Sequence[float] = (),
                         games: Sequence[pb.GameResult] = (), opponents: Sequence[str] = (),
                         env_steps: int = 0) -> bytes:
    """A serialized ``ActorMessage{batch}`` that copies the payload once.

    Building the proto objects would copy a large payload into the batch, again into the
    message, and again when serializing. Protobuf lets fields come in any order, so the
    small fields are serialized normally and the payload field is appended as raw bytes.
    """
    head = pb.TrajectoryBatch(seq=seq, policy_version=policy_version, num_transitions=num_transitions,
                              codec=int(Codec.parse(codec)), priorities=priorities, games=games,
                              opponents=opponents, env_steps=env_steps).SerializeToString()
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


def split_batch_payload(data: Buffer) -> tuple[Buffer, memoryview | None]:
    """A serialized ``ActorMessage``'s bytes with its batch's payload cut out, and that payload as a
    view of ``data``: a protobuf parse would copy it, twice with the read. The mirror of
    :func:`encode_batch_message`. Bytes it cannot frame plainly, a payload under
    ``ZERO_COPY_MIN_BYTES`` and a message without one come back whole, with None, for protobuf to parse or refuse."""
    view = memoryview(data).cast("B")
    try:
        batch = _only_field(view, 0, len(view), pb.ActorMessage, "batch")
        if batch is None:
            return data, None
        payload = _only_field(view, batch[1], batch[2], pb.TrajectoryBatch, "payload")
    except IndexError:
        return data, None
    if payload is None or payload[2] - payload[1] < ZERO_COPY_MIN_BYTES:
        return data, None
    (batch_key, start, end), (payload_key, payload_start, payload_end) = batch, payload
    inner = end - start - (payload_end - payload_key)
    head = b"".join((view[:batch_key], _field_key(pb.ActorMessage, "batch"), _varint(inner), view[start:payload_key],
                     view[payload_end:]))
    return head, view[payload_start:payload_end]


def _only_field(view: memoryview, start: int, end: int, message_class, field: str) -> tuple[int, int, int] | None:
    """Where the one length-delimited ``field`` of the message in ``view[start:end]`` lies (its key's
    offset, its body's start and end), or None if it is absent, repeated or the bytes do not frame."""
    number, found, at = message_class.DESCRIPTOR.fields_by_name[field].number, None, start
    while at < end:
        key_at = at
        key, at = _read_varint(view, at)
        wire_type = key & 7
        if wire_type == 0:
            _, at = _read_varint(view, at)
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            size, at = _read_varint(view, at)
            if key >> 3 == number:
                if found is not None:
                    return None
                found = (key_at, at, at + size)
            at += size
        else:  # groups: protobuf's to judge
            return None
    return found if at == end else None


def _read_varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = view[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")
