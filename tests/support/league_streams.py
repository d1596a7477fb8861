"""Tic-tac-toe self-play sessions spoken raw: a served learner, an actor's Hello, batches carrying games."""

from __future__ import annotations

import contextlib

import numpy as np

from actorlearner import specs, wire
from actorlearner.config import LeagueConfig, LearnerConfig
from actorlearner.envs import make_env
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.v1 import learner_pb2 as pb
from multiagent_envs import RANDOM, TICTACTOE


def game(opponent: str, outcome: int, seat: str = "x", length: int = 5) -> pb.GameResult:
    return pb.GameResult(opponent=opponent, outcome=outcome, seat=seat, length=length)


def ttt_config(tmp_path, **overrides) -> LearnerConfig:
    options = dict(env=TICTACTOE, port=0, min_replay_size=64, batch_size=32, publish_every=1, eval_every=0,
                   league=LeagueConfig(snapshot_every=2, max_snapshots=3, scripted=RANDOM),
                   checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=3600)
    options.update(overrides)
    return LearnerConfig(**options)


def ttt_hello(actor_id: str, **fields) -> pb.ActorMessage:
    env = make_env(TICTACTOE)
    spec = specs.env_spec(TICTACTOE, env.observation_space(env.possible_agents[0]),
                          env.action_space(env.possible_agents[0]), env.possible_agents)
    return pb.ActorMessage(hello=pb.Hello(actor_id=actor_id, protocol_version=wire.PROTOCOL_VERSION,
                                          algorithm="dqn", env_spec=spec, policy_version=-1, **fields))


def ttt_batch(learner: Learner, seq: int, games: list[pb.GameResult], opponents: list[str], n: int = 8) -> pb.ActorMessage:
    fields = {name: np.zeros((n, *shape), wire.np_dtype(dtype)) for name, (shape, dtype) in learner.fields.items()}
    fields["discount"][:] = 0.99
    return pb.ActorMessage.FromString(wire.encode_batch_message(
        seq, 0, n, wire.encode_batch(fields), wire.Codec.MSGPACK, [1.0] * n, games, opponents))


@contextlib.contextmanager
def ttt_learner_at(tmp_path, **overrides):
    """A tic-tac-toe self-play learner (``ttt_config``) serving on a free port; yields it and its address."""
    learner = Learner(ttt_config(tmp_path, **overrides))
    try:
        with serve(learner, "127.0.0.1", 0) as port:
            yield learner, f"127.0.0.1:{port}"
    finally:
        learner.stop()
