"""The replay's row layout: each item's fields, key and policy version packed into one byte row.

Rows live in a ring of ``capacity`` slots (item key ``k`` in slot ``k % capacity``), so
sampling gathers one row per item (one memory access instead of one per field).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import torch

FieldSpec = tuple[tuple[int, ...], torch.dtype]
# Byte offset, byte size, shape and dtype of each column in a row.
Layout = dict[str, tuple[int, int, tuple[int, ...], torch.dtype]]
# Per-item bookkeeping stored in the same row as the item's fields.
KEY, VERSION = "__key__", "__version__"


def row_layout(fields: Mapping[str, FieldSpec]) -> tuple[Layout, int]:
    """Byte offsets of each field in a row: widest dtypes first so every field is aligned."""
    layout, offset = {}, 0
    for name, (shape, dtype) in sorted(fields.items(), key=lambda kv: -kv[1][1].itemsize):
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        layout[name] = (offset, nbytes, shape, dtype)
        offset += nbytes
    return layout, -(-offset // 8) * 8


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype that holds the same values as torch's ``dtype``."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def gather_rows(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``rows[slots]`` as a fresh tensor, copied as int64 words (rows are padded to 8 bytes).

    On CPU the output is allocated by numpy, which asks for transparent huge pages: a large
    sample (e.g. 4096 Atari frames, 230 MB) then faults in far fewer pages, 3x faster.
    """
    words = rows.view(torch.int64)
    if rows.device.type == "cpu":
        out = torch.from_numpy(np.empty((slots.shape[0], words.shape[1]), dtype=np.int64))
        return torch.index_select(words, 0, slots, out=out).view(torch.uint8)
    return words.index_select(0, slots).view(torch.uint8)


def typed_columns(rows: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Typed views ``(len(rows), *shape)`` of each field inside a block of byte rows."""
    by_dtype: dict[torch.dtype, torch.Tensor] = {}
    out = {}
    for name, (offset, nbytes, shape, dtype) in layout.items():
        if dtype not in by_dtype:
            by_dtype[dtype] = rows.view(dtype)
        start, stop = offset // dtype.itemsize, (offset + nbytes) // dtype.itemsize
        column = by_dtype[dtype][:, start:stop]
        out[name] = column.view(rows.shape[0], *shape) if len(shape) != 1 else column
    return out


def ring_parts(start: int, n: int, capacity: int) -> list[tuple[int, int, int]]:
    """Where ``n`` items from slot ``start`` land in a ring of ``capacity`` slots: one or two
    ``(first slot, end slot, offset of the first item)``."""
    first = min(n, capacity - start)
    return [(start, start + first, 0)] + ([(0, n - first, first)] if n > first else [])


def typed_column(rows: torch.Tensor, layout: Layout, name: str) -> torch.Tensor:
    """The typed view ``(len(rows), *shape)`` of field ``name`` inside a block of byte rows."""
    return typed_columns(rows, {name: layout[name]})[name]
