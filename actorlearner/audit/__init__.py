"""Audits of device code that run on any device, the CPU included: host reads (a sync on CUDA), host
traffic (tensors made from host values, blocking copies: what CUDA-graph capture refuses), launches
per operation, and the addresses a captured step must keep. CI has no GPU: these are how the GPU
path's promises are checked there."""

from actorlearner.audit.launches import DeviceLaunches
from actorlearner.audit.reads import HostReads
from actorlearner.audit.state import held_tensors, state_addresses
from actorlearner.audit.traffic import BLOCKING, KINDS, HostTraffic

__all__ = ["BLOCKING", "KINDS", "DeviceLaunches", "HostReads", "HostTraffic", "held_tensors", "state_addresses"]
