"""What the learner tells actors it expects (its LearnerSpec) and whom it lets in: the check of each Hello."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actorlearner import specs, wire
from actorlearner.streaming.broadcast import ONNX_FORMAT
from actorlearner.v1 import learner_pb2 as pb


@dataclass(frozen=True)
class Refusal:
    """Why a stream is refused: a gRPC status code name and a reason."""

    code: str
    reason: str


def field_specs(fields: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> list[pb.FieldSpec]:
    """Replay or policy fields as FieldSpecs, in their order."""
    return [pb.FieldSpec(name=name, dtype=wire.np_dtype(dtype).name, shape=list(shape))
            for name, (shape, dtype) in fields.items()]


def _describe_fields(fields) -> str:
    """FieldSpecs for a message: name:dtype[shape], comma-separated."""
    return ", ".join(f"{f.name}:{f.dtype}{list(f.shape)}" for f in fields)


def check_hello(hello: pb.Hello, spec: pb.LearnerSpec, env_name: str, onnx: bool) -> Refusal | None:
    """Refuse a stream whose protocol or env spec differs from ``spec``, or whose actor holds a policy or
    batches of another algorithm or batch layout; or asks for ONNX policies this learner (``onnx``) cannot
    send."""
    if not hello.actor_id:
        return Refusal("INVALID_ARGUMENT", "Hello.actor_id must not be empty")
    if hello.protocol_version != wire.PROTOCOL_VERSION:
        return Refusal("FAILED_PRECONDITION", f"protocol version {hello.protocol_version} is not supported; "
                                              f"this learner speaks {wire.PROTOCOL_VERSION}")
    mismatch = specs.spec_mismatch(spec.env_spec, hello.env_spec)
    if mismatch:
        return Refusal("FAILED_PRECONDITION", f"env spec differs from the learner's ({env_name}): {mismatch}")
    if hello.algorithm and hello.algorithm != spec.algorithm:
        return Refusal("FAILED_PRECONDITION", f"the actor holds a policy and batches of algorithm "
                                              f"{hello.algorithm!r}; this learner runs {spec.algorithm!r}: "
                                              "restart the actor to follow it")
    if hello.policy_format not in ("", "state_dict", ONNX_FORMAT):
        return Refusal("INVALID_ARGUMENT", f"policy_format {hello.policy_format!r} is not one of state_dict, "
                                           f"{ONNX_FORMAT}")
    if hello.policy_format == ONNX_FORMAT and not onnx:
        return Refusal("FAILED_PRECONDITION", f"algorithm {spec.algorithm!r} has no export_policy: "
                                              "this learner cannot send its policy as ONNX")
    if hello.batch_fields and list(hello.batch_fields) != list(spec.batch_fields):
        return Refusal("FAILED_PRECONDITION", f"the actor holds batches with fields "
                                              f"{_describe_fields(hello.batch_fields)}; this learner expects "
                                              f"{_describe_fields(spec.batch_fields)}: restart the actor")
    return None
