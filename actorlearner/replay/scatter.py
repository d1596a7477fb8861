"""Scatters with repeated indices as a fixed sequence of device operations: :func:`last_write_wins`
(the torch sum tree, the device replay's updates and the Triton kernels' large updates share it)."""

from __future__ import annotations

import torch


def last_write_wins(indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices sorted, each occurrence of one carrying the value of its last occurrence in the input, so
    that a scatter of all of them writes that value in any order: a fixed sequence of device operations."""
    if indices.numel() == 1:
        return indices, values
    order = torch.sort(indices, stable=True).indices
    indices, values = indices.index_select(0, order), values.index_select(0, order)
    n = indices.shape[0]
    position = torch.arange(n, device=indices.device)
    run_ends = torch.where(torch.cat((indices[1:] != indices[:-1], indices.new_ones(1, dtype=torch.bool))),
                           position, n)
    last = run_ends.flip(0).cummin(0).values.flip(0)  # the end of each position's run of equal indices
    return indices, values.index_select(0, last)
