"""Prometheus metrics over HTTP: each process exposes numbers read fresh at every scrape.

A component passes a function returning :class:`Metric` values; nothing is counted twice
and nothing runs between scrapes. Names get the ``actorlearner_`` prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


@dataclass(frozen=True)
class Metric:
    """One metric: a single value, or one value per label value (e.g. per actor)."""

    name: str
    help: str
    value: float | Mapping[str, float]
    counter: bool = False
    label: str = "actor"


class _Collector:
    def __init__(self, read: Callable[[], Iterable[Metric]]):
        self.read = read

    def collect(self):
        for metric in self.read():
            family_class = CounterMetricFamily if metric.counter else GaugeMetricFamily
            name = f"actorlearner_{metric.name}"
            if isinstance(metric.value, Mapping):
                family = family_class(name, metric.help, labels=[metric.label])
                for label, value in metric.value.items():
                    family.add_metric([label], float(value))
            else:
                family = family_class(name, metric.help, value=float(metric.value))
            yield family


def serve_metrics(host: str, port: int, read: Callable[[], Iterable[Metric]]) -> tuple[WSGIServer, int]:
    """Serve ``read()`` at ``http://host:port/metrics``; returns the server and its bound port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(read))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
