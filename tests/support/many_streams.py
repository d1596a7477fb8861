"""Many Connect streams from one process: grpc.aio, a few channels (one TCP connection each), every stream a task.

``python many_streams.py ADDRESS PREFIX CHANNELS`` reads commands on stdin; each answer ends with a line of its own:

- ``open N`` opens N more streams (actor ids PREFIX-0, PREFIX-1, ...), spread over the channels. Each sends a
  Hello naming the learner's env spec (GetSpec) and its current policy version (GetStatus), so that no policy
  follows the Welcome; then, once welcomed, :data:`BATCHES` small batches, and waits for their acks. Once every
  new stream is acked or over, it answers ``open TOTAL welcomed W acked A errors E`` (counts over all streams),
  an ``error ACTOR_ID CODE DETAILS`` line for each stream that ended early (at most :data:`ERRORS_SHOWN`),
  and ``done``.
- ``close`` cancels every stream, as killed actors' streams end, closes the channels, and answers ``closed``.

Streams stay open between commands: nothing is read from them once acked, and the learner sends them
nothing more while it does not train. End of stdin ends the process.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from actorlearner import wire
from actorlearner.transport import grpc_options
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from streams import CONNECT, batch

BATCHES = 2
"""Batches each stream sends once welcomed (seq 1, 2)."""

TRANSITIONS = 4
"""Transitions per batch."""

ERRORS_SHOWN = 10

OPEN_TIMEOUT = 240.0
"""Longest one stream may take from its call to its last ack."""


class Streams:
    """The open streams, over ``channels`` channels of their own (no subchannel shared between them)."""

    def __init__(self, address: str, prefix: str, channels: int):
        self.prefix = prefix
        options = [*grpc_options(64 << 20), ("grpc.use_local_subchannel_pool", 1)]
        self.channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(channels)]
        self.connects = [channel.stream_stream(CONNECT, request_serializer=pb.ActorMessage.SerializeToString,
                                               response_deserializer=pb.LearnerMessage.FromString)
                         for channel in self.channels]
        self.calls: list[grpc.aio.StreamStreamCall] = []
        self.welcomed = self.acked = 0
        self.errors: list[str] = []

    async def open(self, count: int) -> None:
        stub = pb_grpc.LearnerStub(self.channels[0])
        spec = await stub.GetSpec(pb.LearnerSpecRequest(), timeout=60)
        version = (await stub.GetStatus(pb.StatusRequest(), timeout=60)).policy_version
        first = len(self.calls)
        await asyncio.gather(*(self._one(i, spec, version) for i in range(first, first + count)))

    async def _one(self, i: int, spec: pb.LearnerSpec, version: int) -> None:
        call = self.connects[i % len(self.connects)]()
        self.calls.append(call)
        hello = pb.Hello(actor_id=f"{self.prefix}-{i}", protocol_version=wire.PROTOCOL_VERSION,
                         algorithm=spec.algorithm, env_spec=spec.env_spec, policy_version=version)
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                await call.write(pb.ActorMessage(hello=hello))
                await self._next(call, "welcome")
                self.welcomed += 1
                for seq in range(1, BATCHES + 1):
                    await call.write(batch(seq, TRANSITIONS, policy_version=max(version, 0)))
                for _ in range(BATCHES):
                    await self._next(call, "ack")
                    self.acked += 1
        except grpc.aio.AioRpcError as exc:
            self.errors.append(f"{hello.actor_id} {exc.code().name} {exc.details()}")
        except (TimeoutError, EOFError) as exc:
            self.errors.append(f"{hello.actor_id} {type(exc).__name__} {exc}")

    @staticmethod
    async def _next(call: grpc.aio.StreamStreamCall, kind: str) -> pb.LearnerMessage:
        """The next message of ``kind``; any other kind first is a protocol surprise, reported as such."""
        message = await call.read()
        if message is grpc.aio.EOF:
            raise EOFError(f"the stream ended before a {kind}: {await call.code()} {await call.details()}")
        if message.WhichOneof("kind") != kind:
            raise EOFError(f"{message.WhichOneof('kind')} came where a {kind} was awaited")
        return message

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            await channel.close()
        self.calls = []


async def main(address: str, prefix: str, channels: int) -> None:
    streams = Streams(address, prefix, int(channels))
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = line.split()
        if command[0] == "open":
            await streams.open(int(command[1]))
            counts = f"welcomed {streams.welcomed} acked {streams.acked} errors {len(streams.errors)}"
            print(f"open {len(streams.calls)} {counts}", flush=True)
            for error in streams.errors[:ERRORS_SHOWN]:
                print(f"error {error}", flush=True)
            print("done", flush=True)
        elif command[0] == "close":
            await streams.close()
            print("closed", flush=True)
        else:
            sys.exit(f"unknown command {line!r}")
    await streams.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
