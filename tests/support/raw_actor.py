"""A hand-driven actor: one Connect stream, tagged batches sent on demand, every Ack read back.

Used in-process, or as its own process (``python raw_actor.py ADDRESS ACTOR_ID TAG``) that
reads ``send SEQ N`` lines on stdin and prints ``welcome``, ``sending SEQ BYTES`` and
``ack SEQ ACCEPTED REASON`` lines, so that a test can kill it at an exact point, and
``ended CODE DETAILS`` if the learner ends the stream.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from streams import RawStream, batch, hello


def tagged_rows(obs: np.ndarray, tag: float) -> dict[int, list[int]]:
    """seq -> sorted row numbers of the transitions tagged ``tag`` (see ``streams.batch``) in a replay's ``obs``."""
    rows = obs[obs[:, 2] == tag]
    return {int(seq): sorted(rows[rows[:, 0] == seq, 1].astype(int).tolist()) for seq in np.unique(rows[:, 0])}


class RawActor:
    """Connect as ``actor_id`` and send batches tagged ``tag``; acks come back as (seq, accepted, reason)."""

    def __init__(self, address: str, actor_id: str, tag: float):
        self.tag = tag
        self._stream = RawStream(address, hello(actor_id))

    def wait_welcome(self, timeout: float = 30) -> None:
        self._stream.next("welcome", timeout)

    def send(self, seq: int, n: int) -> int:
        """Queue one tagged batch of ``n`` transitions; returns its size on the wire in bytes."""
        return self._stream.send(batch(seq, n, tag=self.tag))

    def ack(self, timeout: float | None = 30) -> tuple[int, bool, str]:
        ack = self._stream.next("ack", timeout).ack
        return ack.seq, ack.accepted, ack.reason

    def exchange(self, seqs, n: int) -> list[tuple[int, bool, str]]:
        """Send a batch for each seq and wait for all their acks."""
        for seq in seqs:
            self.send(seq, n)
        return sorted(self.ack() for _ in seqs)

    def ended(self) -> str:
        """How the stream ended: its status code and details."""
        return f"{self._stream.code} {self._stream.details}"

    def close(self) -> None:
        self._stream.close()


_stdout = threading.Lock()


def say(line: str) -> None:
    """Print one whole line: the sender and the ack reader both print, and print writes the text and
    its newline apart, so that without the lock one line could land inside another ("sending 2 969ack 1 1")."""
    with _stdout:
        print(line, flush=True)


def main(address: str, actor_id: str, tag: str) -> None:
    actor = RawActor(address, actor_id, float(tag))
    actor.wait_welcome()
    say("welcome")

    def report():
        try:
            while True:
                seq, accepted, reason = actor.ack(timeout=None)
                say(f"ack {seq} {int(accepted)} {reason}".rstrip())
        except AssertionError:  # the stream ended: say how, so that a waiting test can tell
            say(f"ended {actor.ended()}")

    threading.Thread(target=report, daemon=True).start()
    for line in sys.stdin:
        command, seq, n = line.split()
        assert command == "send", line
        say(f"sending {seq} {actor.send(int(seq), int(n))}")


if __name__ == "__main__":
    main(*sys.argv[1:])
