"""A checkpoint written by an older learner (commit 001d627, by tests/support/old_checkpoint.py) loads into
this one whole, and training and exactly-once ingest go on from it."""

import shutil
from pathlib import Path

from old_checkpoint import SEQS, TRANSITIONS, UPDATES, batch, config

from actorlearner.learner.learner import Learner
from actorlearner.v1 import learner_pb2 as pb

WRITTEN_BY_001D627 = Path(__file__).parent / "data" / "checkpoint-001d627"


def test_a_checkpoint_from_before_the_exactly_once_part_loads_whole_and_ingest_goes_on_exactly_once(tmp_path):
    shutil.copytree(WRITTEN_BY_001D627, tmp_path / "ckpt")
    learner = Learner(config(str(tmp_path / "ckpt")))
    assert learner.replay.exactly_once.seq_table == SEQS
    assert len(learner.replay) == TRANSITIONS * sum(SEQS.values()) and learner.updates == UPDATES
    assert sorted(record.actor_id for record in learner.registry.records()) == sorted(SEQS)
    assert set(learner.replay.sample(64).data["obs"][:, 0].tolist()) <= {1.0, 2.0, 3.0, 4.0, 5.0}  # the stored rows

    session = learner.connect(pb.Hello(actor_id="a", env_spec=learner.env_spec))
    assert not learner.ingest(session, batch(learner, SEQS["a"]))  # stored before the checkpoint: a resend
    assert learner.ingest(session, batch(learner, SEQS["a"] + 1))
    assert learner.replay.exactly_once.seq_table == {**SEQS, "a": SEQS["a"] + 1}
    assert learner.training.train_step() and learner.updates == UPDATES + 1
