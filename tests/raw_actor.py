"""A hand-driven actor: one Connect stream, tagged batches sent on demand, every Ack recorded.

Used in-process, or as its own process (``python raw_actor.py ADDRESS ACTOR_ID TAG``) that
reads ``send SEQ N`` lines on stdin and prints ``welcome`` and ``ack SEQ ACCEPTED REASON``
lines, so that a test can kill it at an exact point.
"""

from __future__ import annotations

import queue
import sys
import threading

import grpc
import numpy as np

from actorlearner import specs, wire
from actorlearner.envs import make_env
from actorlearner.transport import grpc_options
from actorlearner.v1 import learner_pb2 as pb

CONNECT = f"/{pb.DESCRIPTOR.services_by_name['Learner'].full_name}/Connect"
ENV = "CartPole-v1"


def tagged_batch(seq: int, n: int, tag: float) -> bytes:
    """A CartPole batch whose rows say who sent them: obs = (seq, row, tag, 0); no real state has angle ``tag``."""
    obs = np.zeros((n, 4), np.float32)
    obs[:, 0], obs[:, 1], obs[:, 2] = seq, np.arange(n), tag
    fields = {"obs": obs, "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
              "discount": np.full(n, 0.99, np.float32), "next_obs": obs.copy()}
    return wire.encode_batch_message(seq, 0, n, wire.encode_batch(fields), wire.Codec.MSGPACK)


def tagged_rows(obs: np.ndarray, tag: float) -> dict[int, list[int]]:
    """seq -> sorted row numbers of the tagged transitions in a replay's ``obs``."""
    rows = obs[obs[:, 2] == tag]
    return {int(seq): sorted(rows[rows[:, 0] == seq, 1].astype(int).tolist()) for seq in np.unique(rows[:, 0])}


class RawActor:
    """Connect as ``actor_id`` and send tagged batches; acks land in :attr:`acks` as (seq, accepted, reason)."""

    def __init__(self, address: str, actor_id: str, tag: float):
        self.tag = tag
        env = make_env(ENV)
        hello = pb.Hello(actor_id=actor_id, protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn",
                         env_spec=specs.env_spec(ENV, env.observation_space, env.action_space), policy_version=-1)
        env.close()
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self._requests.put(pb.ActorMessage(hello=hello).SerializeToString())
        self.acks: queue.Queue[tuple[int, bool, str]] = queue.Queue()
        self.welcomed = threading.Event()
        self._channel = grpc.insecure_channel(address, options=grpc_options(64 << 20))
        connect = self._channel.stream_stream(CONNECT, request_serializer=None,
                                              response_deserializer=pb.LearnerMessage.FromString)
        self._call = connect(iter(self._requests.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, seq: int, n: int) -> int:
        """Queue one tagged batch of ``n`` transitions; returns its size on the wire in bytes."""
        message = tagged_batch(seq, n, self.tag)
        self._requests.put(message)
        return len(message)

    def ack(self, timeout: float = 30) -> tuple[int, bool, str]:
        return self.acks.get(timeout=timeout)

    def exchange(self, seqs, n: int) -> list[tuple[int, bool, str]]:
        """Send a batch for each seq and wait for all their acks."""
        for seq in seqs:
            self.send(seq, n)
        return sorted(self.ack() for _ in seqs)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._channel.close()

    def _read(self) -> None:
        try:
            for message in self._call:
                kind = message.WhichOneof("kind")
                if kind == "welcome":
                    self.welcomed.set()
                elif kind == "ack":
                    self.acks.put((message.ack.seq, message.ack.accepted, message.ack.reason))
        except grpc.RpcError:
            pass


def main(address: str, actor_id: str, tag: str) -> None:
    actor = RawActor(address, actor_id, float(tag))
    if not actor.welcomed.wait(30):
        raise SystemExit("no Welcome")
    print("welcome", flush=True)

    def report():
        while True:
            seq, accepted, reason = actor.ack(timeout=None)
            print(f"ack {seq} {int(accepted)} {reason}".rstrip(), flush=True)

    threading.Thread(target=report, daemon=True).start()
    for line in sys.stdin:
        command, seq, n = line.split()
        assert command == "send", line
        print(f"sending {seq} {actor.send(int(seq), int(n))}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
