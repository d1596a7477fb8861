"""Gymnasium spaces as ordered leaves: one replay field, and one encoder input, per leaf.

A non-composite space is a single leaf with key ``""``. Dict and Tuple spaces are walked in
their own order; nested keys are joined with "/" (``"camera"``, ``"sensors/imu"``, ``"pair/0"``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

MAX_DEPTH = 8
"""Deepest nesting of Dict/Tuple spaces accepted."""

BOX_DTYPES = tuple(np.dtype(name) for name in (
    "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float16", "float32", "float64",
))
"""Element types a Box leaf may have."""

LEAF_TYPES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)

Path = tuple[str | int, ...]


def _one_line(space: gym.Space, limit: int = 160) -> str:
    text = " ".join(str(space).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class UnsupportedSpace(ValueError):
    """A space (or a part of one) that no network here can take; the message is one line."""

    def __init__(self, role: str, space: gym.Space, path: Path = (),
                 reason: str = "use Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple"):
        where = f' at "{"/".join(map(str, path))}"' if path else ""
        super().__init__(f"{role} space {_one_line(space)}{where} is not supported: {reason}")


def _walk(space: gym.Space, role: str, path: Path = ()) -> Iterator[tuple[Path, gym.Space]]:
    """(path, leaf space) for every leaf in order; UnsupportedSpace for anything else."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        if len(path) >= MAX_DEPTH:
            raise UnsupportedSpace(role, space, path, f"Dict/Tuple nested deeper than {MAX_DEPTH}")
        if not space.spaces:
            raise UnsupportedSpace(role, space, path, f"an empty {type(space).__name__} has no leaves")
        children = space.spaces.items() if isinstance(space, spaces.Dict) else enumerate(space.spaces)
        for key, child in children:
            if isinstance(space, spaces.Dict) and not (isinstance(key, str) and key and "/" not in key):
                raise UnsupportedSpace(role, space, path, f"Dict key {key!r} is not a non-empty string without '/'")
            yield from _walk(child, role, (*path, key))
        return
    if not isinstance(space, LEAF_TYPES):
        raise UnsupportedSpace(role, space, path)
    if isinstance(space, spaces.Box) and space.dtype not in BOX_DTYPES:
        raise UnsupportedSpace(role, space, path, f"Box dtype must be one of {', '.join(map(str, BOX_DTYPES))}")
    if np.prod(space.shape) == 0:
        raise UnsupportedSpace(role, space, path, f"its shape {space.shape} has no elements")
    yield path, space


def _key(path: Path) -> str:
    return "/".join(map(str, path))


def leaf_spaces(space: gym.Space, role: str = "observation") -> dict[str, gym.Space]:
    """Every leaf of ``space`` by key, in the space's own order."""
    return {_key(path): leaf for path, leaf in _walk(space, role)}


def leaf_fields(space: gym.Space) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every leaf's per-item shape and the dtype its values are stored in."""
    return {key: (tuple(leaf.shape), np.dtype(leaf.dtype)) for key, leaf in leaf_spaces(space).items()}


def leaf_arrays(space: gym.Space, batch: Any) -> dict[str, np.ndarray]:
    """A batched value (as a gymnasium vector env returns it) split into ``{key: array[E, *shape]}``.

    Each array has its leaf's storage dtype (cast only when it differs); ValueError when a
    leaf's per-item shape is not the space's.
    """
    return leaf_splitter(space)(batch)


def leaf_splitter(space: gym.Space) -> Callable[[Any], dict[str, np.ndarray]]:
    """:func:`leaf_arrays` for one space, its leaves found once: for a hot loop."""
    leaves = [(path, _key(path), np.dtype(leaf.dtype), tuple(leaf.shape)) for path, leaf in _walk(space, "observation")]

    def split(batch: Any) -> dict[str, np.ndarray]:
        arrays = {}
        for path, key, dtype, shape in leaves:
            value = batch
            for step in path:
                value = value[step]
            array = np.asarray(value, dtype=dtype)
            if array.ndim == 0 or array.shape[1:] != shape:
                raise ValueError(f'leaf "{key}" has batch shape {array.shape}; expected (E, *{shape})')
            arrays[key] = array
        return arrays
    return split


def field_name(prefix: str, key: str) -> str:
    """The replay field of a leaf: ``"obs"`` for the single leaf, else ``"obs/camera"``."""
    return f"{prefix}/{key}" if key else prefix
