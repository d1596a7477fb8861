"""The tensors an object holds, found by walking it: a trainer's networks and optimizer state, a replay's
storage, a step's metric sums. What :class:`~actorlearner.audit.HostTraffic` takes for device memory,
and what a captured step must find at the same address every time (:func:`state_addresses`)."""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from actorlearner.pinned import is_pinned

_LEAVES = (str, bytes, int, float, bool, type(None), np.ndarray, np.generic, torch.Generator, torch.dtype,
           torch.device, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType,
           threading.Thread, threading.Event, type(threading.Lock()), threading.Condition)


def held_tensors(*roots: object, grads: bool = False, depth: int = 8) -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor the roots hold, through attributes, containers, networks (their
    parameters and buffers, and with ``grads`` their gradients) and optimizers (state and tensor options).
    Pinned host buffers are not device memory and are left out."""
    seen: set[int] = set()

    def walk(value: object, path: str, left: int) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(value, torch.Tensor):
            if id(value) not in seen and not is_pinned(value):
                seen.add(id(value))
                yield path, value
            return
        if left == 0 or isinstance(value, _LEAVES) or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, nn.Module):
            for name, tensor in (*value.named_parameters(), *value.named_buffers()):
                yield from walk(tensor, f"{path}.{name}", left - 1)
                if grads and isinstance(tensor, nn.Parameter) and tensor.grad is not None:
                    yield from walk(tensor.grad, f"{path}.{name}.grad", left - 1)
        elif isinstance(value, torch.optim.Optimizer):
            for index, state in enumerate(value.state.values()):
                yield from walk(state, f"{path}.state[{index}]", left - 1)
            for index, group in enumerate(value.param_groups):
                yield from walk({k: v for k, v in group.items() if k != "params"}, f"{path}.group[{index}]", left - 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from walk(item, f"{path}[{key!r}]", left - 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for index, item in enumerate(value):
                yield from walk(item, f"{path}[{index}]", left - 1)
        elif isinstance(getattr(value, "__dict__", None), dict):  # (some extension objects fake theirs)
            for key, item in vars(value).items():
                yield from walk(item, f"{path}.{key}", left - 1)

    for index, root in enumerate(roots):
        yield from walk(root, f"<{index}:{type(root).__name__}>", depth)


def state_addresses(*roots: object) -> dict[str, int]:
    """Where each tensor the roots hold lives (gradients aside: a captured step allocates them from its
    own pool). A CUDA graph reads and writes these addresses on every replay, so they must not change
    between steps: state rebound to a new tensor is invisible to the graph."""
    return {path: tensor.data_ptr() for path, tensor in held_tensors(*roots)}
