"""``run``'s actor processes, forked from it: they start with its imports and build their envs meanwhile.

``run`` forks them before it builds its learner or starts a thread: each begins with the modules ``run`` has
imported (torch, the actor's) instead of importing them again, builds its envs while the learner is built,
then waits on a pipe for the learner's address."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time

from actorlearner.lifeline import PARENT_ENV

_FORK = mp.get_context("fork")


class LocalActor:
    """``actorlearner actor ARGV`` in a forked child of this process, which ends with it (``PARENT_ENV``);
    :meth:`connect` sends it the learner's address."""

    def __init__(self, argv: list[str], environ: dict[str, str], name: str):
        if threading.active_count() != 1:  # a lock another thread held at the fork would never be released
            raise RuntimeError("run forks its actors before it starts a thread")
        receive, self._send = _FORK.Pipe(duplex=False)
        self._process = _FORK.Process(target=_act, args=(receive, argv, {**environ, PARENT_ENV: str(os.getpid())}),
                                      name=name)
        self._process.start()
        receive.close()

    def connect(self, address: str) -> None:
        """Have the actor stream to the learner at ``address``."""
        self._send.send(address)
        self._send.close()

    def poll(self) -> int | None:
        """Its exit code (negative: the signal that ended it), or None while it runs."""
        return self._process.exitcode


def stop_actors(actors: list[LocalActor], timeout: float = 15.0) -> None:
    """SIGTERM each actor (one still waiting for an address ends at once), then SIGKILL whatever has not exited
    by ``timeout``."""
    for actor in actors:
        if actor.poll() is None:
            actor._process.terminate()
    deadline = time.monotonic() + timeout
    for actor in actors:
        actor._process.join(max(0.0, deadline - time.monotonic()))
        if actor.poll() is None:
            actor._process.kill()
            actor._process.join()
        actor._send.close()


def _act(receive, argv: list[str], environ: dict[str, str]) -> None:
    """The child: wait for the learner's address (``run`` SIGTERMs one it never sends it), then be the actor."""
    os.environ.update(environ)  # credentials by environment, as for a started actor: never in its argv
    address = receive.recv()
    receive.close()
    from actorlearner.cli import main

    sys.exit(main(["actor", "--learner", address, *argv]))
