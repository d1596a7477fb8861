"""gRPC health checking (grpc.health.v1) for the learner, actors and env servers.

The overall service ("") answers SERVING once the process is ready and NOT_SERVING while
it drains; Kubernetes' native ``grpc:`` probes ask it without a token (the auth
interceptor lets health checks through). An actor also reports ``CONNECTED`` ("connected"
service): SERVING while its stream to the learner is up.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from actorlearner.transport import add_port

CONNECTED = "connected"
"""The actor's readiness service: SERVING while it is connected to the learner."""


class Health:
    """One process's health statuses, served on an existing server or on a port of its own."""

    def __init__(self):
        self.servicer = health.HealthServicer()
        self.servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._server: grpc.Server | None = None

    def add_to(self, server: grpc.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def listen(self, host: str, port: int) -> int:
        """Serve health checks on a small server of their own (plaintext: kubelet probes speak no TLS)."""
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
        self.add_to(self._server)
        bound = add_port(self._server, f"{host}:{port}", None)
        self._server.start()
        return bound

    def set(self, serving: bool, service: str = "") -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.servicer.set(service, status)

    def close(self) -> None:
        self.servicer.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
