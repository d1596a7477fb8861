"""A figure a part of the learner reports, declared once: where it shows (GetStatus, Prometheus, the progress
line, TensorBoard) follows from the one declaration, and its value is read fresh at each."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from actorlearner.metrics import Metric
from actorlearner.v1 import learner_pb2 as pb


@dataclass(frozen=True)
class Figure:
    """One number and the places it shows; an empty name leaves that place out.

    Attributes:
        read: the value now.
        metric: the Prometheus name (``actorlearner_`` is prefixed), with ``help``; ``counter`` if it only rises.
        status: the ``StatusResponse`` field it fills.
        line: its key in the progress line (``run`` and ``learner`` print it).
        tag: the TensorBoard scalar written with the trainer's metrics, at the update count.
    """

    read: Callable[[], float]
    metric: str = ""
    help: str = ""
    counter: bool = False
    status: str = ""
    line: str = ""
    tag: str = ""


def status(figures: Iterable[Figure], response: pb.StatusResponse) -> None:
    """Fill ``response``'s fields that figures name; a NaN figure (nothing measured yet) leaves its field unset."""
    for figure in figures:
        if figure.status and not math.isnan(value := figure.read()):
            setattr(response, figure.status, value)


def metrics(figures: Iterable[Figure]) -> list[Metric]:
    return [Metric(f.metric, f.help, f.read(), counter=f.counter) for f in figures if f.metric]


def line(figures: Iterable[Figure]) -> dict[str, float]:
    return {f.line: f.read() for f in figures if f.line}


def scalars(figures: Iterable[Figure]) -> dict[str, float]:
    return {f.tag: f.read() for f in figures if f.tag}
