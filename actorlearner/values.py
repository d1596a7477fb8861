"""Observations, actions, infos and options <-> env.proto ``Value`` messages.

The generic functions handle any nesting of arrays, dicts, tuples and text and validate
every tensor like ``wire.decode_array``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from actorlearner import wire
from actorlearner.v1 import env_pb2

MAX_DEPTH = 16
"""Deepest nesting of Dict/Tuple spaces and values accepted from the wire."""


def tensor_to_proto(array: Any) -> env_pb2.Tensor:
    """A Tensor message of ``array`` (numpy scalars and Python numbers become rank-0)."""
    encoded = wire.encode_array(np.asarray(array))  # the one dtype whitelist; WireError is a ValueError
    return env_pb2.Tensor(dtype=encoded["dtype"], shape=encoded["shape"], data=bytes(encoded["data"]))


def tensor_from_proto(tensor: env_pb2.Tensor, max_bytes: int = wire.DEFAULT_MAX_BYTES) -> np.ndarray:
    """The array of a Tensor message, validated like every wire array; a writable copy."""
    return wire.decode_array({"dtype": tensor.dtype, "shape": list(tensor.shape), "data": tensor.data},
                             max_bytes, writable=True)


def value_to_proto(value: Any, _depth: int = 0) -> env_pb2.Value:
    """A Value message of an observation, action, info entry or option.

    Arrays and numbers become tensors, mappings DictValues, tuples and lists TupleValues,
    strings text; anything else raises ValueError naming its type.
    """
    if _depth > MAX_DEPTH:
        raise ValueError(f"values nested deeper than {MAX_DEPTH} are not supported")
    if isinstance(value, (np.ndarray, np.generic, bool, int, float)):
        return env_pb2.Value(tensor=tensor_to_proto(value))
    if isinstance(value, str):
        return env_pb2.Value(text=value)
    if isinstance(value, Mapping):
        return env_pb2.Value(dict=dict_to_proto(value, _depth + 1))
    if isinstance(value, (tuple, list)):
        return env_pb2.Value(tuple=env_pb2.TupleValue(items=[value_to_proto(v, _depth + 1) for v in value]))
    raise ValueError(f"a {type(value).__name__} cannot be sent as an env value")


def value_from_proto(message: env_pb2.Value, space: spaces.Space | None = None,
                     max_bytes: int = wire.DEFAULT_MAX_BYTES, _depth: int = 0) -> Any:
    """The Python value of a Value message: arrays, dicts, tuples, str.

    A rank-0 tensor becomes a numpy scalar, except as the value of an array space (Box,
    MultiBinary, MultiDiscrete), where it stays a 0-d array as gymnasium samples it.
    """
    if _depth > MAX_DEPTH:
        raise wire.WireError(f"values nested deeper than {MAX_DEPTH}")
    kind = message.WhichOneof("kind")
    if kind == "tensor":
        array = tensor_from_proto(message.tensor, max_bytes)
        keep_array = isinstance(space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete))
        return array[()] if array.ndim == 0 and not keep_array else array
    if kind == "dict":
        subspaces = space.spaces if isinstance(space, spaces.Dict) else {}
        return dict_from_proto(message.dict, max_bytes, _depth + 1, subspaces)
    if kind == "tuple":
        subspaces = list(space.spaces) if isinstance(space, spaces.Tuple) else []
        items = message.tuple.items
        return tuple(value_from_proto(item, subspaces[i] if i < len(subspaces) else None, max_bytes, _depth + 1)
                     for i, item in enumerate(items))
    if kind == "text":
        return message.text
    raise wire.WireError("value message has no kind set")


def dict_to_proto(mapping: Mapping[str, Any], _depth: int = 0) -> env_pb2.DictValue:
    """A DictValue of a mapping with text keys (an info dict, reset options)."""
    return env_pb2.DictValue(entries=[env_pb2.DictValue.Entry(key=text_key(key, mapping),
                                                              value=value_to_proto(v, _depth))
                                      for key, v in mapping.items()])


def dict_from_proto(message: env_pb2.DictValue, max_bytes: int = wire.DEFAULT_MAX_BYTES, _depth: int = 0,
                    subspaces: Mapping[str, spaces.Space] | None = None) -> dict:
    """The dict of a DictValue; WireError on repeated keys."""
    out = {}
    for entry in message.entries:
        if entry.key in out:
            raise wire.WireError(f"dict value repeats key {entry.key!r}")
        out[entry.key] = value_from_proto(entry.value, (subspaces or {}).get(entry.key), max_bytes, _depth)
    return out


def text_key(key: Any, owner: Any) -> str:
    if not isinstance(key, str):
        raise ValueError(f"key {key!r} of {type(owner).__name__} is not a string; only string keys can be sent")
    return key

