"""One learner step (replay sample -> algorithm update -> new priorities) as one device program.

On CUDA, with a replay that has a `DeviceSampling` (`PrioritizedReplay.device_sampling`: the device
path) and a `CapturableTrainer`, each phase of the step is captured once in a CUDA graph and replayed:
a few launches a step and no host read. Everywhere else the same code runs eagerly. Metrics are summed
on the device and read every so many steps (one host read, which also tells what the replay refused
meanwhile: see `PrioritizedReplay.check_errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping

import torch

from actorlearner.algorithms import Trainer
from actorlearner.replay import DeviceSampling, NothingRecentEnough, PrioritizedReplay, Sample

logger = logging.getLogger(__name__)

WARMUP_STEPS = 3
"""Eager steps of a phase on a side stream before it is captured (lazy state, allocator pools)."""

DRAW_ON_DEVICE = object()
"""What :meth:`LearnerStep.prepare` gives when the captured step draws its own sample."""


class MetricSums:
    """A step's metrics summed without reading them: eager steps' 0-d tensors are kept as they are (no
    device work at all), each captured graph adds its own into device sums of its own (made before
    its capture, never reallocated: the graph writes them on every replay); :meth:`read` reads all at once."""

    MAX_KEPT = 4096
    """Kept tensors past which they are folded into device sums (a caller that never reads)."""

    def __init__(self):
        self._kept: list[tuple[str, torch.Tensor]] = []
        self._folded: dict[str, torch.Tensor] = {}  # eager steps' folded sums, 0-d on the device
        self._captured: list[tuple[tuple[str, ...], torch.Tensor]] = []  # each graph's names and sums
        self._host: dict[str, float] = {}  # metrics given as numbers
        self.count = 0

    def add(self, metrics: Mapping[str, torch.Tensor | float]) -> None:
        """One eager step's metrics."""
        for name, value in metrics.items():
            if isinstance(value, torch.Tensor):
                self._kept.append((name, value.detach() if value.requires_grad else value))
            else:
                self._host[name] = self._host.get(name, 0.0) + float(value)
        self.count += 1
        if len(self._kept) > self.MAX_KEPT:
            self.fold()

    def fold(self) -> None:
        """Add the kept tensors into the folded sums (device work, no read)."""
        for name, value in self._kept:
            value = value.reshape(()).to(torch.float64)
            self._folded[name] = self._folded[name].add_(value) if name in self._folded else value.clone()
        self._kept.clear()

    def adder(self, names: tuple[str, ...], device: torch.device) -> Callable[[Mapping[str, torch.Tensor]], None]:
        """A function adding metrics of these names into device sums of its own, in place: device work
        only, which a captured step records."""
        sums = torch.zeros(len(names), dtype=torch.float64, device=device)
        self._captured.append((names, sums))

        def add_on_device(metrics: Mapping[str, torch.Tensor]) -> None:
            sums.add_(_stacked([metrics[name].detach() for name in names]))
        return add_on_device

    def read(self) -> dict[str, float]:
        """The mean of each metric since the last read, in one host read; then starts again."""
        totals = dict(self._host)
        names, parts = [], []
        for captured_names, sums in self._captured:
            names += captured_names
            parts.append(sums)
        if self._folded:
            names += self._folded
            parts.append(torch.stack(list(self._folded.values())))
        if self._kept:
            names += [name for name, _ in self._kept]
            parts.append(_stacked([value for _, value in self._kept]))
        if parts:
            for name, value in zip(names, (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()):
                totals[name] = totals.get(name, 0.0) + value
        for _, sums in self._captured:
            sums.zero_()
        self._folded.clear()
        self._kept.clear()
        self._host = dict.fromkeys(self._host, 0.0)
        count, self.count = self.count, 0
        return {name: value / count for name, value in totals.items()} if count else {}


def _stacked(values: list[torch.Tensor]) -> torch.Tensor:
    """One float64 vector of scalar tensors: two ops when they share a dtype and are 0-d (the usual case)."""
    if all(value.dim() == 0 and value.dtype == values[0].dtype for value in values):
        return torch.stack(values).to(torch.float64)
    return torch.stack([value.reshape(()).to(torch.float64) for value in values])


class LearnerStep:
    """``step(min_policy_version)`` runs one step; :meth:`read_metrics` gives the metric means since the last read.

    ``replay``: a :class:`PrioritizedReplay`, or anything that samples and takes priorities as it does (the
    learner's replay service, which holds the buffer and its lock). ``capture``: None captures on CUDA when
    the trainer and the replay allow it (the replay's :class:`DeviceSampling` on CUDA, the trainer's
    device); False never does. A caller that acts between the host half of a step and the rest (data-parallel
    ranks agree there) calls :meth:`prepare` and :meth:`run`; ``step()`` is the two in a row.
    """

    def __init__(self, trainer: Trainer, replay: PrioritizedReplay, batch_size: int, *, capture: bool | None = None):
        self.trainer, self.replay, self.batch_size = trainer, replay, batch_size
        self._sampling: DeviceSampling | None = replay.device_sampling()  # what a captured step draws through
        can = (trainer.capturable and self._sampling is not None and self._sampling.device.type == "cuda"
               and torch.device(trainer.device) == self._sampling.device)
        self.capture = can if capture is None else capture and can
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph | int] = {}  # phase -> its graph, or warm-up steps so far
        self.capture_error: str | None = None
        """Why the step could not be captured (it runs eagerly since), or None."""
        self.metrics = MetricSums()

    def __call__(self, min_policy_version: int | None = None) -> bool:
        """One step; False when nothing is recent enough to sample (the caller waits and tries again)."""
        prepared = self.prepare(min_policy_version)
        if prepared is None:
            return False
        self.run(prepared)
        return True

    def prepare(self, min_policy_version: int | None = None) -> Sample | object | None:
        """The host half of a step: the sample to learn from, :data:`DRAW_ON_DEVICE` when the captured step
        will draw it, or None when nothing is recent enough."""
        try:
            if not self.capture:
                return self.replay.sample(self.batch_size, min_policy_version=min_policy_version)
            if self._sampling.start_sample(self.batch_size, min_policy_version):
                return DRAW_ON_DEVICE
            return self._sampling.draw_on_host(self.batch_size)  # zero priorities: reads
        except NothingRecentEnough:
            return None

    def run(self, prepared: Sample | object) -> None:
        """The rest of the step :meth:`prepare` began: the update and its new priorities (eagerly on a sample)."""
        if prepared is DRAW_ON_DEVICE:
            self._captured_step()
            return
        priorities, metrics = self.trainer.update(prepared)
        self.replay.update_priorities(prepared.indices, priorities)
        self.metrics.add(metrics)

    def read_metrics(self) -> dict[str, float]:
        """The mean of each metric over the steps since the last read (one host read); raises what the
        replay refused meanwhile."""
        means = self.metrics.read()
        self.replay.check_errors()
        return means

    def _device_step(self) -> Mapping[str, torch.Tensor]:
        """Draw, learn, set priorities: device work only (what a graph captures)."""
        sample = self._sampling.draw(self.batch_size)
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
            self.metrics.add(metrics)
            if entry + 1 < WARMUP_STEPS:
                self._graphs[phase] = entry + 1
            else:
                self._try_capture(phase, tuple(metrics))
        else:
            self._sampling.launch(entry)  # its metrics go to the sums inside the graph
            self.metrics.count += 1
        self.trainer.advance()

    def _try_capture(self, phase: Hashable, names: tuple[str, ...]) -> None:
        """Capture one step of ``phase`` (recording runs nothing: this step already ran eagerly); a step
        that can't be captured (a trainer breaking `CapturableTrainer`'s rules) runs eagerly from now on."""
        graph = torch.cuda.CUDAGraph()
        add_metrics = self.metrics.adder(names, self.replay.device)
        try:
            for generator in self.trainer.generators():
                graph.register_generator_state(generator)
            for optimizer in self.trainer.optimizers().values():
                optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients from its own pool
            # Ingest threads copy into the replay meanwhile: only this thread's calls must be capture-safe.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                add_metrics(self._device_step())
        except Exception as exc:
            logger.warning("the learner step could not be captured in a CUDA graph; it runs eagerly", exc_info=True)
            self.capture, self.capture_error = False, f"{type(exc).__name__}: {exc}"
            return
        self._graphs[phase] = graph
        logger.info("learner step captured in a CUDA graph (phase %r)", phase)
