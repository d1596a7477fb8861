"""Tic-tac-toe self-play sessions spoken raw: a served learner, an actor's Hello, batches carrying games."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np

from actorlearner import specs, wire
from actorlearner.config import LeagueConfig, LearnerConfig
from actorlearner.envs import make_env
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.v1 import learner_pb2 as pb
from multiagent_envs import RANDOM, TICTACTOE
from streams import RawStream


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


def spec_fields(spec: pb.LearnerSpec) -> dict[str, tuple[tuple[int, ...], str]]:
    """A learner's batch fields as its GetSpec answer gives them (what ``Learner.fields`` holds in-process)."""
    return {f.name: (tuple(f.shape), f.dtype) for f in spec.batch_fields}


def ttt_batch(fields: Mapping[str, tuple], seq: int, games: list[pb.GameResult], opponents: list[str],
              n: int = 8) -> pb.ActorMessage:
    """A batch of ``n`` zero transitions with the layout ``fields`` (name -> (shape, dtype)), carrying ``games``."""
    fields = {name: np.zeros((n, *shape), wire.np_dtype(dtype)) for name, (shape, dtype) in fields.items()}
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


def snapshots_then_menu(stream: RawStream, menu_size: int) -> tuple[list[tuple[str, int, bytes]], list[str]]:
    """The snapshots a stream got, as (opponent, version, whole payload), until a menu of ``menu_size``
    opponents; and that menu's ids. Every snapshot a menu names must have come whole before it."""
    snapshots: list[tuple[str, int, bytes]] = []
    assembler = wire.ChunkAssembler()
    while True:
        message = stream.next()
        kind = message.WhichOneof("kind")
        if kind == "policy_update" and message.policy_update.opponent:
            update = message.policy_update
            payload = assembler.add(update.version, update.chunk_index, update.chunk_count, update.total_bytes,
                                    update.payload)
            if payload is not None:
                snapshots.append((update.opponent, update.version, payload))
        elif kind == "league":
            ids = [o.id for o in message.league.opponents]
            assert {s for s, _, _ in snapshots} >= {o.id for o in message.league.opponents if o.version >= 0}, \
                (ids, [(s, v) for s, v, _ in snapshots])
            if len(ids) == menu_size:
                return snapshots, ids
