"""Bytes <-> arrays for everything that crosses a process boundary; the only such place.

Arrays and their checks are in :mod:`.arrays`, trajectory batches in :mod:`.batches`,
policy weights and their chunks in :mod:`.weights`; callers use them as ``wire.X``.

Only :mod:`.weights` needs torch, and it is imported on first use of one of its names: an env process (the env
server, an env worker) uses arrays and batches alone and starts without torch, a second or more sooner.
"""

from importlib import import_module

from actorlearner.wire.arrays import (DEFAULT_MAX_BYTES, DTYPES, MAX_RANK, Spec, WireError, decode_array,
                                      encode_array, np_dtype)
from actorlearner.wire.batches import FRAMES, Codec, decode_batch, decode_priorities, encode_batch, encode_batch_message
from actorlearner.v1 import learner_pb2

_WEIGHTS = ("TORCH_DTYPES", "ChunkAssembler", "check_state_dict", "decode_state_dict", "encode_state_dict",
            "split_chunks", "state_dict_spec")


def __getattr__(name: str):
    if name in _WEIGHTS:
        return getattr(import_module("actorlearner.wire.weights"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PROTOCOL_VERSION: int = learner_pb2.PROTOCOL_VERSION
"""Version of the actor <-> learner protocol (``Hello.protocol_version``): the proto's ``Protocol`` enum holds it."""

__all__ = ["DEFAULT_MAX_BYTES", "DTYPES", "FRAMES", "MAX_RANK", "PROTOCOL_VERSION", "TORCH_DTYPES", "ChunkAssembler", "Codec",
           "Spec", "WireError", "check_state_dict", "decode_array", "decode_batch", "decode_priorities", "decode_state_dict",
           "encode_array", "encode_batch", "encode_batch_message", "encode_state_dict", "np_dtype", "split_chunks",
           "state_dict_spec"]
