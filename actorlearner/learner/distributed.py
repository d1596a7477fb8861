"""Data-parallel learners: the process group, lockstep agreement, gradient averaging, parameter broadcast.

Every rank is a whole learner with its own actors, replay shard, rate limiter and priorities.
The ranks train in lockstep: before each update they agree (one all-reduce) whether every
rank has a sample, whether any is stopping, whether a checkpoint is due and whether the roles
have state to share (a self-play league's results: :meth:`DataParallel.gather`), so that no rank
waits in a collective for one that will not join. Each optimizer step of the algorithm's trainer
first averages the gradients over the ranks (a step pre-hook on every ``torch.optim.Optimizer``
its ``optimizers()`` names), and rank 0's trainer state is broadcast at start, so that the parameters
stay identical on every rank after every update. NCCL when every rank has a GPU of its own; gloo on
CPUs, and on GPUs some ranks share (NCCL refuses that; gloo all-reduces and broadcasts CUDA tensors too).
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from actorlearner.algorithms import Trainer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class World:
    """This learner's place among the data-parallel learners."""

    size: int
    rank: int
    address: str  # HOST:PORT where rank 0 holds the rendezvous; empty for a world of one


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    if not environ.get(name):
        return None
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {environ[name]!r}") from None


def resolve_world(world_size: int, rank: int, dist_address: str, environ: Mapping[str, str] | None = None) -> World:
    """The world from the learner's options, falling back to what torchrun and Kubernetes operators set:
    WORLD_SIZE, RANK (else the ``-N`` suffix of a StatefulSet pod's HOSTNAME), MASTER_ADDR and MASTER_PORT.
    ValueError says what is missing or out of range."""
    environ = os.environ if environ is None else environ
    size = world_size or _env_int(environ, "WORLD_SIZE") or 1
    if size < 1:
        raise ValueError(f"world_size must be >= 1, got {size}")
    if size == 1:
        if rank > 0:
            raise ValueError(f"rank {rank} needs a world_size above it, got world_size 1")
        return World(1, 0, "")
    if rank < 0:
        rank = _env_int(environ, "RANK")
    if rank is None:
        match = re.search(r"-(\d+)$", environ.get("HOSTNAME", ""))
        if match is None:
            raise ValueError(f"world_size {size} needs this learner's rank: --rank, RANK, or a HOSTNAME ending in -N")
        rank = int(match.group(1))
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    address = dist_address
    if not address and environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        address = f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"world_size {size} needs --dist-address HOST:PORT (or MASTER_ADDR and MASTER_PORT) "
                         f"of rank 0's rendezvous, got {address!r}")
    return World(size, rank, address)


def local_device(device: torch.device, environ: Mapping[str, str] | None = None,
                 gpus: int | None = None) -> torch.device:
    """A rank's device: CUDA without an index becomes the GPU torchrun's LOCAL_RANK names (else the first),
    for ranks sharing a host need one each, in turn when the host has fewer ``gpus`` (default: the count
    CUDA sees) than local ranks; any other device as it is."""
    if device.type != "cuda" or device.index is not None:
        return device
    local_rank = _env_int(os.environ if environ is None else environ, "LOCAL_RANK") or 0
    return torch.device("cuda", local_rank % (torch.cuda.device_count() if gpus is None else gpus))


def device_identity(device: torch.device) -> str:
    """What :func:`choose_backend` compares across ranks: the device type, and a GPU's UUID (the same
    physical GPU whatever index or CUDA_VISIBLE_DEVICES a rank sees it by)."""
    return f"cuda {torch.cuda.get_device_properties(device).uuid}" if device.type == "cuda" else device.type


def choose_backend(devices: Sequence[str]) -> tuple[str, str]:
    """The process group's backend for ranks on ``devices`` (each rank's :func:`device_identity`, by rank),
    and why when it is not the usual one: NCCL when every rank has a GPU of its own, gloo on CPUs and when
    ranks share a GPU (NCCL needs one per rank). ValueError for ranks on different kinds of device."""
    kinds = {identity.split()[0] for identity in devices}
    if len(kinds) > 1:
        ranks = ", ".join(f"rank {rank} on {identity.split()[0]}" for rank, identity in enumerate(devices))
        raise ValueError(f"the data-parallel ranks must train on one kind of device, got {ranks}")
    if kinds != {"cuda"}:
        return "gloo", ""
    first: dict[str, int] = {}
    for rank, identity in enumerate(devices):
        if identity in first:
            return "gloo", (f"ranks {first[identity]} and {rank} share GPU {identity.split()[1]} "
                            "(NCCL needs one GPU per rank)")
        first[identity] = rank
    return "nccl", ""


class SingleRank:
    """A learner on its own: a world of one, where every agreement is the rank's own word."""

    captures = True
    """Whether a training round may run as one captured device step (nothing to all-reduce inside it)."""

    def __init__(self, world: World):
        self.world = world

    def agree(self, ready: bool, stop: bool, checkpoint: bool, share: bool) -> tuple[bool, bool, bool, bool]:
        return ready, stop, checkpoint, share

    def gather(self, message: bytes) -> list[bytes]:
        """Every rank's ``message``, in rank order."""
        return [message]

    def extremes(self, value: int) -> tuple[int, int]:
        return value, value

    def check_same(self, what: str, text: str) -> None:
        """Nothing to compare with."""

    def average_gradients(self, trainer: Trainer) -> None:
        """One rank's gradients are their own mean."""

    def broadcast_state(self, trainer: Trainer) -> None:
        """No other rank to follow."""

    def close(self) -> None:
        """Nothing to leave."""


def join_world(world: World, device: torch.device, timeout: float) -> Ranks:
    """This learner's place among the ranks: the process group when there are others, else a world of one."""
    return DataParallel(world, device, timeout) if world.size > 1 else SingleRank(world)


class DataParallel:
    """One rank's membership of the process group (joined on construction, waiting for every rank): the
    same calls as :class:`SingleRank`, each a collective over the ranks."""

    captures = False
    """Its optimizer steps all-reduce the gradients, which a CUDA graph cannot hold: rounds run eagerly."""

    def __init__(self, world: World, device: torch.device, timeout: float):
        self.world = world
        self.device = device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        host, _, port = world.address.rpartition(":")
        store = dist.TCPStore(host.strip("[]"), int(port), world.size, world.rank == 0, timedelta(seconds=timeout))
        store.set(f"actorlearner/device/{world.rank}", device_identity(device))
        backend, why = choose_backend([store.get(f"actorlearner/device/{rank}").decode()
                                       for rank in range(world.size)])
        logger.info("rank %d of %d on %s: joining the %s process group at %s%s", world.rank, world.size, device,
                    backend, world.address, f": {why}" if why else "")
        dist.init_process_group(backend, store=store, world_size=world.size, rank=world.rank,
                                timeout=timedelta(seconds=timeout))

    def agree(self, ready: bool, stop: bool, checkpoint: bool, share: bool) -> tuple[bool, bool, bool, bool]:
        """(every rank ready, any rank stopping, any rank's checkpoint due, any rank's share due), in one
        all-reduce."""
        flags = torch.tensor([ready, not stop, not checkpoint, not share], dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        all_ready, none_stop, none_due, none_share = flags.tolist()
        return bool(all_ready), not none_stop, not none_due, not none_share

    def gather(self, message: bytes) -> list[bytes]:
        """Every rank's ``message``, in rank order: lengths, then the bytes padded to the longest, in two
        all-gathers (raw bytes, never pickled: a rank unpickling another's objects would run its code)."""
        size = self.world.size
        length = torch.tensor([len(message)], dtype=torch.int64, device=self.device)
        lengths = [torch.empty_like(length) for _ in range(size)]
        dist.all_gather(lengths, length)
        counts = [int(n) for n in lengths]
        padded = torch.zeros(max(counts), dtype=torch.uint8)
        if message:
            padded[:len(message)] = torch.frombuffer(bytearray(message), dtype=torch.uint8)
        padded = padded.to(self.device)
        everyone = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(everyone, padded)
        return [bytes(part[:count].cpu().numpy()) for part, count in zip(everyone, counts)]

    def extremes(self, value: int) -> tuple[int, int]:
        """The least and the greatest of ``value`` over the ranks."""
        both = torch.tensor([value, -value], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MIN)
        return int(both[0]), -int(both[1])

    def check_same(self, what: str, text: str) -> None:
        """ValueError unless every rank passes the same ``text`` (compared by checksum)."""
        low, high = self.extremes(zlib.crc32(text.encode()))
        if low != high:
            raise ValueError(f"the ranks differ in {what}: every data-parallel learner must run the same")

    def average_gradients(self, trainer: Trainer) -> None:
        """Make every optimizer step of ``trainer`` first replace each gradient by its mean over the ranks."""
        optimizers = trainer.optimizers()
        if not optimizers:
            raise ValueError(f"trainer {type(trainer).__name__} has no torch optimizer (an attribute or "
                             "optimizers()) whose gradients data-parallel learners could average")
        for optimizer in optimizers.values():
            optimizer.register_step_pre_hook(self._average)

    def _average(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        """Step pre-hook: one SUM all-reduce per dtype over the flattened gradients, divided by the world size."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(self.world.size)
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    def broadcast_state(self, trainer: Trainer) -> None:
        """Give every rank rank 0's trainer state (networks, targets, optimizer slots, counters, generators)."""
        state = trainer.state_dict()
        keys = sorted(state)
        layout = [(k, tuple(state[k].shape), str(state[k].dtype)) if isinstance(state[k], torch.Tensor)
                  else (k, type(state[k]).__name__) for k in keys]
        self.check_same("algorithm state layout", repr(layout))
        received = {}
        for key in keys:
            value = state[key]
            if isinstance(value, torch.Tensor):
                tensor = value.to(self.device).contiguous()
            else:
                tensor = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64,
                                      device=self.device)
            dist.broadcast(tensor, src=0)
            received[key] = tensor.cpu() if isinstance(value, torch.Tensor) else type(value)(tensor.item())
        if self.world.rank != 0:
            trainer.load_state_dict(received)

    def close(self) -> None:
        """Leave the process group (once), so that its threads end before the interpreter does: left
        running, they abort the process at exit (std::terminate, exit -6) after a clean stop."""
        if dist.is_initialized():
            dist.destroy_process_group()


Ranks = SingleRank | DataParallel
"""This learner's place among the ranks, and the calls that keep them in lockstep."""
