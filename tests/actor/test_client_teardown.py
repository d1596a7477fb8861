"""A client's streams end with it: a closed learner link or remote env leaves no gRPC request thread
and no call behind, also when close comes while a stream is being opened. A call left over to the
interpreter's exit can hang the process there: its ``__del__`` waits on a lock that a gRPC thread,
frozen by the exit, may hold."""

from __future__ import annotations

import sys
import threading
import weakref

import gymnasium as gym
import pytest

from actorlearner import wire
from actorlearner.actor.link import LearnerLink
from actorlearner.config import LearnerConfig
from actorlearner.envs.remote import RemoteEnv
from actorlearner.envs.server import serve as serve_env
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.v1 import learner_pb2 as pb
from procs import wait_until


def in_function(thread: threading.Thread, name: str) -> bool:
    """Whether ``thread`` is running function ``name`` (anywhere on its stack)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    return frame is not None


def request_threads() -> int:
    """Threads on which gRPC is reading a stream's requests (each ends once its request iterator does)."""
    return sum(in_function(thread, "consume_request_iterator") for thread in threading.enumerate())


@pytest.fixture
def learner():
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0))
    with serve(learner, "127.0.0.1", 0) as port:
        yield learner, port
    learner.stop()


def link_to(learner: Learner, port: int) -> LearnerLink:
    hello = pb.Hello(actor_id="closer", protocol_version=wire.PROTOCOL_VERSION, algorithm=learner.config.algorithm,
                     env_spec=learner.env_spec, batch_fields=learner.batch_fields, policy_version=-1)
    return LearnerLink(f"127.0.0.1:{port}", hello, 16 << 20, reconnect_initial=0.05)


def test_a_closed_link_leaves_no_request_thread_and_drops_its_call(learner):
    learner, port = learner
    before = request_threads()
    link = link_to(learner, port).start()
    wait_until(lambda: link.connected, 60, "the link welcomed")
    call = weakref.ref(link._stream[1])
    link.close()
    assert not link._thread.is_alive()
    assert call() is None, "the stream's call outlived it"
    wait_until(lambda: request_threads() <= before, 60, "gRPC's request thread of the stream ended")


def test_close_while_a_stream_is_being_opened_opens_none(learner):
    """The link's thread is held inside `_serve_stream` (the test holds the link's lock), close begins,
    then the thread goes on: it must not open a stream that nothing would end."""
    learner, port = learner
    link = link_to(learner, port)
    with link._lock:
        link.start()
        wait_until(lambda: in_function(link._thread, "_serve_stream"), 60, "the link's thread opening a stream")
        closing = threading.Thread(target=link.close)
        closing.start()
        wait_until(link._closing.is_set, 60, "close begun")
    closing.join()
    assert not link._thread.is_alive()
    assert link.connects == 0 and link._stream is None
    assert not learner.status().actors, "the learner never heard of the actor"


def test_a_closed_remote_env_leaves_no_request_thread_and_drops_its_call():
    before = request_threads()
    with serve_env(lambda: gym.make("CartPole-v1"), "CartPole-v1") as (_, port):
        env = RemoteEnv(f"127.0.0.1:{port}")
        env.reset(seed=1)
        env.step(0)
        call = weakref.ref(env._link.responses)
        env.close()
        assert call() is None, "the session's call outlived it"
        wait_until(lambda: request_threads() <= before, 60, "gRPC's request thread of the session ended")
