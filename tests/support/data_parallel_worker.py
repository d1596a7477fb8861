"""One rank of a data-parallel learner world for tests/learner/test_data_parallel.py, as its own process.

``python data_parallel_worker.py RANK WORLD ADDRESS CHECKPOINT_DIR STEPS OUT ALGORITHM``: builds the rank's
Learner (restoring CHECKPOINT_DIR/rank-R when there is one), inserts batches only this rank has,
runs STEPS lockstep train steps, checkpoints, and writes as JSON to OUT what it held: digests of
the algorithm state after the restore and after every step, the version after every step, and
digests of its replay shard, seq table and limiter, and why it refused to change the algorithm's lr.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import torch

from actorlearner import wire
from actorlearner.algorithms.dqn import DQNConfig
from actorlearner.algorithms.sac import SACConfig
from actorlearner.algorithms.td3 import TD3Config
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.parameters import ParameterError
from actorlearner.v1 import learner_pb2 as pb


SETTINGS = {
    "dqn": dict(env="CartPole-v1", algorithm_config=DQNConfig(hidden_sizes=(32, 32), target_update_period=7)),
    "sac": dict(env="Pendulum-v1", algorithm="sac", algorithm_config=SACConfig(hidden_sizes=(32, 32))),
    "td3": dict(env="Pendulum-v1", algorithm="td3", algorithm_config=TD3Config(hidden_sizes=(32, 32))),
}
"""Each algorithm's env and small networks."""


def digest(state: dict) -> str:
    """sha256 over a flat state's names and values (tensors by their bytes)."""
    h = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        h.update(name.encode())
        h.update(value.contiguous().numpy().tobytes() if isinstance(value, torch.Tensor) else repr(value).encode())
    return h.hexdigest()


def insert(learner: Learner, actor_id: str, seq: int, n: int = 32) -> None:
    """A batch of random transitions, drawn from a generator seeded by ``actor_id`` and ``seq``."""
    rng = np.random.default_rng([seq, *actor_id.encode()])
    fields = {}
    for name, (shape, dtype) in learner.fields.items():
        values = rng.uniform(-1, 1, (n, *shape))
        fields[name] = (values if dtype.is_floating_point else values > 0).astype(wire.np_dtype(dtype))
    fields.update(discount=np.full_like(fields["discount"], 0.97))
    message = pb.ActorMessage.FromString(
        wire.encode_batch_message(seq, 0, n, wire.encode_batch(fields), wire.Codec.MSGPACK, priorities=[1.0] * n))
    assert learner.ingest(learner.connect(pb.Hello(actor_id=actor_id, policy_version=-1)), message.batch)


def shard(learner: Learner) -> dict:
    return {"replay": digest(learner.replay.buffer.state_dict()), "size": len(learner.replay),
            "seq_table": dict(learner.replay.exactly_once.seq_table), "limiter": learner.replay.limiter.state_dict()}


def main(rank: int, world: int, address: str, checkpoint_dir: str, steps: int, out: str, algorithm: str) -> None:
    config = LearnerConfig(device="cpu", replay_capacity=4096, min_replay_size=64, batch_size=32,
                           rate_error_buffer=1e6, publish_every=5, eval_every=0, checkpoint_dir=checkpoint_dir,
                           world_size=world, rank=rank, dist_address=address, dist_timeout=120,
                           **SETTINGS[algorithm])
    learner = Learner(config)
    result = {"restored": {"algorithm": digest(learner.trainer.state_dict()), "updates": learner.updates,
                           "version": learner.version, **shard(learner)}}
    first = learner.replay.exactly_once.seq_table.get(f"rank-{rank}", 0)
    for seq in range(first + 1, first + 5):
        insert(learner, f"rank-{rank}", seq)
    result["steps"] = []
    for _ in range(steps):
        assert learner.training.train_step()
        learner.publishing.flush()  # a version this step published is out
        result["steps"].append({"algorithm": digest(learner.trainer.state_dict()), "version": learner.version,
                                "updates": learner.updates, "policy": hashlib.sha256(learner.broadcast.payload).hexdigest()})
    learner.checkpoint()
    result["saved"] = {"algorithm": digest(learner.trainer.state_dict()), "updates": learner.updates,
                       "version": learner.version, **shard(learner)}
    try:
        learner.set_parameters([(f"{algorithm}-lr", "1e-4"), ("samples-per-insert", "4")])
    except ParameterError as exc:
        result["refused"] = str(exc)
    learner.set_parameters([("samples-per-insert", "4")])  # a shard's own pace may differ
    learner.data_parallel.close()
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    rank, world, address, checkpoint_dir, steps, out, algorithm = sys.argv[1:]
    main(int(rank), int(world), address, checkpoint_dir, int(steps), out, algorithm)
