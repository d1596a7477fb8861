"""Everything about a gRPC connection that servers and clients share: options, TLS and tokens.

Servers: :func:`add_port` listens with TLS (mutual when a CA is given) or in plaintext,
and :func:`auth_interceptors` refuses calls without the bearer token (UNAUTHENTICATED),
except gRPC health checks, which Kubernetes' probes send without one. Clients:
:func:`open_channel` dials with the same settings and sends the token on every call.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

import grpc

HEALTH_PREFIX = "/grpc.health.v1.Health/"


@dataclass
class SecurityConfig:
    """Authentication and TLS, the same fields for servers and clients."""

    auth_token: str = ""
    """Bearer token every call must carry; prefer ACTORLEARNER_AUTH_TOKEN or auth_token_file to the flag."""
    auth_token_file: str = ""
    """File holding the bearer token (wins over auth_token)."""
    tls_cert: str = ""
    """PEM certificate: the server's own, or the client's for mutual TLS."""
    tls_key: str = ""
    """PEM private key of tls_cert."""
    tls_ca: str = ""
    """PEM CA bundle: servers require client certificates signed by it; clients verify the server with it."""

    def token(self) -> str:
        """The bearer token, from the file when one is named; empty means no token."""
        if self.auth_token_file:
            token = Path(self.auth_token_file).read_text().strip()
            if not token:
                raise ValueError(f"auth token file {self.auth_token_file} is empty")
            return token
        return self.auth_token

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert or self.tls_ca)

    @property
    def authenticated(self) -> bool:
        """True when strangers are kept out: a token, or client certificates checked against a CA."""
        return bool(self.auth_token or self.auth_token_file or (self.tls_cert and self.tls_ca))


def grpc_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel and server options: messages up to ``max_message_bytes``; keepalive that notices dead peers."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def add_port(server: grpc.Server, address: str, security: SecurityConfig | None) -> int:
    """Listen on ``address`` with TLS when a certificate is configured; the bound port (OSError if none)."""
    if security is not None and security.tls_cert:
        if not security.tls_key:
            raise ValueError("tls_cert needs tls_key")
        credentials = grpc.ssl_server_credentials([(_read(security.tls_key), _read(security.tls_cert))],
                                                  root_certificates=_read(security.tls_ca),
                                                  require_client_auth=bool(security.tls_ca))
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return port


def _refusal_handlers(refuse) -> dict[tuple[bool, bool], grpc.RpcMethodHandler]:
    """``refuse`` as a handler of each kind, keyed by (request streaming, response streaming)."""
    return {
        (False, False): grpc.unary_unary_rpc_method_handler(refuse),
        (True, False): grpc.stream_unary_rpc_method_handler(refuse),
        (False, True): grpc.unary_stream_rpc_method_handler(refuse),
        (True, True): grpc.stream_stream_rpc_method_handler(refuse),
    }


class _TokenCheck(grpc.ServerInterceptor):
    """Refuse every call but health checks unless it carries ``authorization: Bearer <token>``."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        async def refuse_async(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self.refusals, self.async_refusals = _refusal_handlers(refuse), _refusal_handlers(refuse_async)

    def passes(self, handler_call_details: grpc.HandlerCallDetails) -> bool:
        """Whether the call is a health check or carries the token."""
        if handler_call_details.method.startswith(HEALTH_PREFIX):
            return True
        sent = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        return hmac.compare_digest(sent.encode(), self._expected)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or self.passes(handler_call_details):
            return handler
        return self.refusals[handler.request_streaming, handler.response_streaming]


def auth_interceptors(security: SecurityConfig | None) -> list[grpc.ServerInterceptor]:
    """The server interceptors ``security`` asks for (none without a token)."""
    token = security.token() if security is not None else ""
    return [_TokenCheck(token)] if token else []


class _AsyncTokenCheck(grpc.aio.ServerInterceptor):
    """:class:`_TokenCheck` for a grpc.aio server."""

    def __init__(self, token: str):
        self._check = _TokenCheck(token)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or self._check.passes(handler_call_details):
            return handler
        return self._check.async_refusals[handler.request_streaming, handler.response_streaming]


def async_auth_interceptors(security: SecurityConfig | None) -> list[grpc.aio.ServerInterceptor]:
    """:func:`auth_interceptors` for a grpc.aio server."""
    token = security.token() if security is not None else ""
    return [_AsyncTokenCheck(token)] if token else []


class _TokenSender(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor,
                   grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor):
    """Add ``authorization: Bearer <token>`` to every call."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        return _Details(details, list(details.metadata or ()) + [self._header])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


class _Details(grpc.ClientCallDetails):
    """Call details with extra metadata (gRPC hands interceptors an immutable object)."""

    def __init__(self, details, metadata):
        self.method, self.timeout, self.credentials = details.method, details.timeout, details.credentials
        self.wait_for_ready, self.compression = details.wait_for_ready, details.compression
        self.metadata = metadata


def open_channel(address: str, security: SecurityConfig | None, options: list | None = None) -> grpc.Channel:
    """A channel to ``address``: TLS when a CA or certificate is configured, the token on every call."""
    if security is not None and security.tls:
        credentials = grpc.ssl_channel_credentials(root_certificates=_read(security.tls_ca),
                                                   private_key=_read(security.tls_key),
                                                   certificate_chain=_read(security.tls_cert))
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    token = security.token() if security is not None else ""
    return grpc.intercept_channel(channel, _TokenSender(token)) if token else channel
