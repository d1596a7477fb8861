"""The process-wide random generators (torch, numpy, ``random``) as a checkpoint part, and back."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def rng_state(device: torch.device) -> dict[str, Any]:
    """The process-wide torch (CPU, and ``device`` if CUDA), numpy and ``random`` generators as a part."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_words, py_gauss = random.getstate()
    state = {"torch.cpu": torch.get_rng_state(), "numpy.kind": np_kind,
             "numpy.keys": torch.from_numpy(np_keys.astype(np.uint32)), "numpy.pos": int(np_pos),
             "numpy.has_gauss": int(np_has_gauss), "numpy.cached_gaussian": float(np_gauss),
             "python.version": py_version, "python.words": torch.tensor(py_words, dtype=torch.int64),
             "python.gauss_next": py_gauss}
    if device.type == "cuda":
        state["torch.cuda"] = torch.cuda.get_rng_state(device)
    return state


def load_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Restore generators saved by :func:`rng_state`; a CUDA state only onto a CUDA ``device``."""
    torch.set_rng_state(state["torch.cpu"])
    if "torch.cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["torch.cuda"], device)
    np.random.set_state((state["numpy.kind"], state["numpy.keys"].numpy(), state["numpy.pos"],
                         state["numpy.has_gauss"], state["numpy.cached_gaussian"]))
    random.setstate((state["python.version"], tuple(state["python.words"].tolist()), state["python.gauss_next"]))
