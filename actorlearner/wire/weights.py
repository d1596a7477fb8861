"""Policy weights on the wire: state dicts <-> one msgpack map, checked against the local model, and chunking."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import torch

from actorlearner.wire.arrays import (DEFAULT_MAX_BYTES, DTYPES, Buffer, Spec, WireError, check_keys, decode_array,
                                      encode_array, np_dtype, unpack)

TORCH_DTYPES: dict[torch.dtype, str] = {getattr(torch, name): name for name in DTYPES}
"""The torch dtypes allowed on the wire, with their wire names."""


def encode_state_dict(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """A policy state dict as one msgpack map of parameter name -> array (CODEC_MSGPACK)."""
    arrays: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        if tensor.dtype not in TORCH_DTYPES:
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
    obj = unpack(payload, max_bytes, "state dict payload", entries)
    if not isinstance(obj, dict):
        raise WireError(f"state dict payload must be a map, got {type(obj).__name__}")
    if not all(isinstance(k, str) for k in obj):
        raise WireError("state dict parameter names must be strings")
    if expected is not None:
        check_keys(obj, expected, "parameter", "FAILED_PRECONDITION")
    out: dict[str, torch.Tensor] = {}
    for name in expected if expected is not None else obj:
        try:
            array = decode_array(obj[name], max_bytes, writable=True)
        except WireError as e:
            raise WireError(f"parameter {name!r}: {e}", e.code) from None
        if expected is not None:
            _check_parameter(name, array.shape, array.dtype, expected[name])
        out[name] = torch.from_numpy(array)
    return out


def check_state_dict(state: Mapping[str, torch.Tensor], expected: Spec) -> None:
    """What ``decode_state_dict(..., expected=expected)`` checks, for a state dict decoded without it."""
    check_keys(state, expected, "parameter", "FAILED_PRECONDITION")
    for name, tensor in state.items():
        _check_parameter(name, tuple(tensor.shape), np_dtype(tensor.dtype), expected[name])


def _check_parameter(name: str, shape: tuple[int, ...], dtype: Any, expected: tuple) -> None:
    want_shape, want_dtype = tuple(map(int, expected[0])), np_dtype(expected[1])
    if shape != want_shape or dtype != want_dtype:
        raise WireError(f"parameter {name!r} is {dtype}{list(shape)}, expected {want_dtype}{list(want_shape)}",
                        "FAILED_PRECONDITION")


def state_dict_spec(
    state_dict: Mapping[str, torch.Tensor],
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The ``expected`` argument of decode_state_dict for a local model's state dict."""
    return {k: (tuple(v.shape), v.dtype) for k, v in state_dict.items()}


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
