"""A torch generator's state in a checkpoint, loadable on any device.

A CPU generator's state (mt19937, 5056 bytes) and a CUDA generator's (Philox seed and offset, 16 bytes)
cannot be set into each other. The state is saved with its device type: on a generator of the same type
it is restored exactly; on another type the generator is reseeded from a hash of the saved state (so the
same checkpoint always gives the same stream there). A state saved without its type is told by its size.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

UNTAGGED_SIZES = {5056: "cpu", 16: "cuda"}
"""Device type of an untagged state (checkpoints from before the tag), by its size in bytes."""


def generator_keys(key: str) -> tuple[str, str]:
    """The state keys :func:`generator_state` writes: the state and its device type."""
    return key, f"{key}.device"


def device_tag(device_type: str) -> Tensor:
    """A device type as a checkpoint holds it: its name's ASCII bytes (uint8)."""
    return torch.tensor(list(device_type.encode("ascii")), dtype=torch.uint8)


def generator_state(generator: torch.Generator, key: str) -> dict[str, Tensor]:
    """``generator``'s state under ``key`` and its :func:`device_tag` under ``key.device``."""
    state_key, device_key = generator_keys(key)
    return {state_key: generator.get_state(), device_key: device_tag(generator.device.type)}


def load_generator_state(generator: torch.Generator, state: Mapping[str, Any], key: str) -> None:
    """Set ``generator`` from what :func:`generator_state` wrote under ``key``: exactly if it was saved on
    the same device type, else reseeded deterministically from the saved state (logged)."""
    state_key, device_key = generator_keys(key)
    saved = torch.as_tensor(state[state_key], dtype=torch.uint8)
    if device_key in state:
        saved_type = bytes(torch.as_tensor(state[device_key]).tolist()).decode("ascii")
    else:
        saved_type = UNTAGGED_SIZES.get(saved.numel(), "an unknown device")
    if saved_type == generator.device.type:
        generator.set_state(saved)
        return
    seed = int.from_bytes(hashlib.blake2b(saved.numpy().tobytes(), digest_size=8).digest(), "little")
    generator.manual_seed(seed)
    logger.info("generator %r was saved on %s, loaded on %s: reseeded with %d derived from its state "
                "(deterministic, but not the stream it would have continued)", key, saved_type,
                generator.device.type, seed)
