"""gRPC options shared by the learner's server and every client: message limits and keepalive."""

from __future__ import annotations


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
