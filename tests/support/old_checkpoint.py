"""Writes the checkpoint in tests/learner/data/ with whatever actorlearner is on the path (the committed one
was written by commit 001d627: from outside the checkout, ``PYTHONPATH=<a checkout of 001d627> python
<this checkout>/tests/support/old_checkpoint.py DIR``).

Actor ``a`` stored seqs 1-3 and actor ``b`` seqs 1-5, 16 transitions each, then 5 updates."""

import sys

import numpy as np

from actorlearner import wire
from actorlearner.algorithms.dqn import DQNConfig
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.v1 import learner_pb2 as pb

SEQS = {"a": 3, "b": 5}
TRANSITIONS = 16
UPDATES = 5


def config(directory: str) -> LearnerConfig:
    return LearnerConfig(env="CartPole-v1", eval_every=0, min_replay_size=64, batch_size=32, checkpoint_dir=directory,
                         checkpoint_replay=True, actor_priorities=False, replay_capacity=1024,
                         algorithm_config=DQNConfig(hidden_sizes=(16,)))


def batch(learner: Learner, seq: int) -> pb.TrajectoryBatch:
    arrays = {name: np.full((TRANSITIONS, *shape), seq if np.issubdtype(dtype, np.floating) else seq % 2, dtype=dtype)
              for name, (shape, dtype) in learner.ingestion.fields.items()}  # observations hold the seq
    return pb.TrajectoryBatch(seq=seq, num_transitions=TRANSITIONS, payload=wire.encode_batch(arrays),
                              policy_version=0, codec=int(wire.Codec.MSGPACK))


if __name__ == "__main__":
    learner = Learner(config(sys.argv[1]))
    for actor_id, last in SEQS.items():
        session = learner.connect(pb.Hello(actor_id=actor_id, env_spec=learner.env_spec))
        for seq in range(1, last + 1):
            assert learner.ingest(session, batch(learner, seq))
    for _ in range(UPDATES):
        assert learner.training.train_step()
    learner.checkpoint()
