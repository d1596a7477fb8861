"""One learner step (replay sample -> algorithm update -> new priorities) as one device program.

On CUDA, with the replay's device path and a `CapturableTrainer`, each phase of the step is captured
once in a CUDA graph and replayed: a few launches a step and no host read. Everywhere else the same
code runs eagerly. Metrics are summed on the device and read every so many steps (one host read,
which also tells what the replay refused meanwhile: see `PrioritizedReplay.check_errors`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Hashable, Mapping

import torch

from actorlearner.algorithms import Trainer
from actorlearner.replay import NothingRecentEnough, PrioritizedReplay
from actorlearner.replay.buffer import Sample
from actorlearner.replay.device import DeviceReplay

logger = logging.getLogger(__name__)

WARMUP_STEPS = 3
"""Eager steps of a phase on a side stream before it is captured (lazy state, allocator pools)."""


class LearnerStep:
    """``step(min_policy_version)`` runs one step; :meth:`read_metrics` gives the metric means since the last read.

    ``capture``: None captures on CUDA when the trainer and the replay allow it; False never does.
    Callers that must act between the sample and the update (data-parallel ranks agree there) use
    :meth:`sample` and :meth:`learn` instead, always eager.
    """

    def __init__(self, trainer: Trainer, replay: PrioritizedReplay, batch_size: int, *, capture: bool | None = None):
        self.trainer, self.replay, self.batch_size = trainer, replay, batch_size
        can = (trainer.capturable and isinstance(replay, DeviceReplay) and replay.device.type == "cuda"
               and torch.device(trainer.device) == replay.device)
        self.capture = can if capture is None else capture and can
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph | int] = {}  # phase -> its graph, or warm-up steps so far
        self._names: tuple[str, ...] = ()
        self._sums: torch.Tensor | None = None  # metric sums on the device since the last read
        self._host_sums: dict[str, float] = {}  # metrics a trainer returned as numbers
        self._count = 0

    def __call__(self, min_policy_version: int | None = None) -> bool:
        """One step; False when nothing is recent enough to sample (the caller waits and tries again)."""
        if not self.capture:
            sample = self.sample(min_policy_version)
            if sample is None:
                return False
            self.learn(sample)
            return True
        try:
            drawable = self.replay.start_sample(self.batch_size, min_policy_version)
            sample = None if drawable else self.replay.draw_on_host(self.batch_size)  # zero priorities: reads
        except NothingRecentEnough:
            return False
        if sample is not None:
            self.learn(sample)
        else:
            self._captured_step()
        return True

    def sample(self, min_policy_version: int | None = None) -> Sample | None:
        """A replay sample, or None when nothing is recent enough."""
        try:
            return self.replay.sample(self.batch_size, min_policy_version=min_policy_version)
        except NothingRecentEnough:
            return None

    def learn(self, sample: Sample, update_lock: contextlib.AbstractContextManager | None = None,
              replay_lock: contextlib.AbstractContextManager | None = None) -> None:
        """The update on ``sample`` (under ``update_lock``) and its new priorities (under ``replay_lock``)."""
        with update_lock or contextlib.nullcontext():
            priorities, metrics = self.trainer.update(sample)
        with replay_lock or contextlib.nullcontext():
            self.replay.update_priorities(sample.indices, priorities)
        self._add(metrics)

    def read_metrics(self) -> dict[str, float]:
        """The mean of each metric over the steps since the last read (one host read); raises what the
        replay refused meanwhile."""
        means = dict(self._host_sums)
        if self._sums is not None:
            means.update(zip(self._names, self._sums.tolist()))
            self._sums.zero_()
        count, self._count = self._count, 0
        self._host_sums = dict.fromkeys(self._host_sums, 0.0)
        self.replay.check_errors()
        return {name: value / count for name, value in means.items()} if count else {}

    def _add(self, metrics: Mapping[str, torch.Tensor | float]) -> None:
        """Sum a step's metrics: tensors on the device, numbers on the host."""
        tensors = {name: value for name, value in metrics.items() if isinstance(value, torch.Tensor)}
        for name, value in metrics.items():
            if name not in tensors:
                self._host_sums[name] = self._host_sums.get(name, 0.0) + float(value)
        if tensors:
            if self._sums is None or tuple(tensors) != self._names:
                self._names = tuple(tensors)
                self._sums = torch.zeros(len(tensors), dtype=torch.float64, device=next(iter(tensors.values())).device)
            self._accumulate(tensors)
        self._count += 1

    def _accumulate(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Add a step's metric tensors to the device sums (device work: a captured step includes it)."""
        self._sums += torch.stack([value.detach().reshape(()).to(torch.float64) for value in tensors.values()])

    def _device_step(self) -> Mapping[str, torch.Tensor]:
        """Draw, learn, set priorities: device work only (what a graph captures)."""
        sample = self.replay.draw(self.batch_size)
        priorities, metrics = self.trainer.learn(sample)
        self.replay.update_priorities(sample.indices, priorities)
        return metrics

    def _captured_step(self) -> None:
        """Replay this phase's graph (capturing it after a few eager warm-up steps), then the host's part."""
        phase = self.trainer.phase()
        entry = self._graphs.get(phase, 0)
        if isinstance(entry, int):  # still warming up: eager on a side stream, as capture requires
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                metrics = self._device_step()
            torch.cuda.current_stream().wait_stream(side)
            self._add(metrics)
            if entry + 1 < WARMUP_STEPS:
                self._graphs[phase] = entry + 1
            else:
                self._try_capture(phase)
        else:
            entry.replay()  # its metrics go to the sums inside the graph
            self._count += 1
        self.trainer.advance()

    def _try_capture(self, phase: Hashable) -> None:
        """Capture one step of ``phase`` (recording runs nothing: this step already ran eagerly); a step
        that can't be captured (a trainer breaking `CapturableTrainer`'s rules) runs eagerly from now on."""
        graph = torch.cuda.CUDAGraph()
        try:
            for generator in self.trainer.generators():
                graph.register_generator_state(generator)
            for optimizer in self.trainer.optimizers().values():
                optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients from its own pool
            # Ingest threads copy into the replay meanwhile: only this thread's calls must be capture-safe.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                metrics = self._device_step()
                self._accumulate(metrics)
        except Exception:
            logger.warning("the learner step could not be captured in a CUDA graph; it runs eagerly", exc_info=True)
            self.capture = False
            return
        self._graphs[phase] = graph
        logger.info("learner step captured in a CUDA graph (phase %r)", phase)
