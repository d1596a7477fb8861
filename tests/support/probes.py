"""What an operator reads of a running process: its gRPC health check and its Prometheus page."""

from __future__ import annotations

import re
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def health(port: int, service: str = "") -> str:
    """The status name a plaintext health check gets, or the gRPC error code's name."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value from a /metrics page."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(actorlearner_\S+) (\S+)$", text, re.M)}
