"""CheckpointStore: round trips, rotation, crash safety, corruption fallback, no pickle; the learner's resume."""

import hashlib
import json
import logging
import pickle
import random
import threading
import time
import tracemalloc

import gymnasium as gym
import msgpack
import numpy as np
import pytest
import torch

from actorlearner import wire
from actorlearner.algorithms.dqn import DQN, DQNConfig
from actorlearner.algorithms.r2d2 import R2D2Config
from actorlearner.algorithms.sac import SACConfig
from actorlearner.algorithms.td3 import TD3Config
from actorlearner.checkpoint.parts import MAGIC, CheckpointError, read_part, write_part
from actorlearner.checkpoint.rng import load_rng_state, rng_state
from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.v1 import learner_pb2 as pb


def sample_parts(step: int = 0) -> dict[str, dict]:
    """Parts with tensors of several dtypes and plain values, varying with ``step``."""
    g = torch.Generator().manual_seed(step)
    return {
        "algorithm": {
            "online.weight": torch.randn(4, 3, generator=g),
            "online.bias": torch.randn(3, generator=g, dtype=torch.float64),
            "half": torch.randn(5, generator=g).half(),
            "num_updates": 1000 + step,
            "lr": 5e-4,
        },
        "replay": {
            "obs": torch.randint(0, 256, (6, 2, 2), generator=g, dtype=torch.uint8),
            "keys": torch.arange(6, dtype=torch.int64) + step,
            "versions": torch.arange(6, dtype=torch.int32),
            "small": torch.tensor([-3, 4], dtype=torch.int8),
            "done": torch.tensor([True, False, True]),
            "empty": torch.zeros(0, 3),
            "scalar": torch.tensor(2.5),
            "max_priority": 1.75,
            "capacity": 1_000_000,
        },
        "learner": {
            "learner_id": "abc",
            "policy_version": 7 + step,
            "seq_table": {"actor-0": 12, "actor-1": 3},
            "resumed": False,
            "note": None,
            "history": [1, 2.5, "x"],
        },
    }


def assert_parts_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for part, state in want.items():
        assert got[part].keys() == state.keys(), part
        for key, value in state.items():
            loaded = got[part][key]
            if isinstance(value, torch.Tensor):
                assert isinstance(loaded, torch.Tensor), key
                assert loaded.dtype == value.dtype and loaded.shape == value.shape, key
                assert torch.equal(loaded, value), key
            else:
                assert type(loaded) is type(value) and loaded == value, key


def test_round_trip_keeps_dtypes_shapes_and_plain_values(tmp_path):
    store = CheckpointStore(tmp_path)
    parts = sample_parts(3)
    path = store.save(3, parts)
    assert path == tmp_path / "ckpt-000000000003"
    assert sorted(p.name for p in path.iterdir()) == [
        "algorithm.part", "learner.part", "manifest.json", "replay.part"]

    step, loaded = store.load_latest()
    assert step == 3
    assert_parts_equal(loaded, parts)
    weight = loaded["algorithm"]["online.weight"]
    weight += 1  # Loaded tensors are ordinary writable CPU tensors.
    assert not torch.equal(weight, parts["algorithm"]["online.weight"])


def test_non_contiguous_and_unsigned_tensors_round_trip(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"t": base.t(), "u16": torch.tensor([1, 65535], dtype=torch.uint16),
             "u32": torch.tensor([7, 2**32 - 1], dtype=torch.uint32)}
    write_part(tmp_path / "x.part", state)
    loaded, _ = read_part(tmp_path / "x.part")
    assert torch.equal(loaded["t"], base.t())
    assert torch.equal(loaded["u16"].to(torch.int64), torch.tensor([1, 65535]))
    assert torch.equal(loaded["u32"].to(torch.int64), torch.tensor([7, 2**32 - 1]))


def test_dqn_state_dict_restores_the_same_network(tmp_path):
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    spec = DQN(obs_space, gym.spaces.Discrete(2))
    agent = spec.make_trainer()
    CheckpointStore(tmp_path).save(10, {"algorithm": agent.state_dict()})

    fresh = spec.make_trainer()
    step, parts = CheckpointStore(tmp_path).load_latest()
    fresh.load_state_dict(parts["algorithm"])
    obs = np.random.default_rng(0).uniform(-1, 1, (16, 4)).astype(np.float32)
    fresh_policy, agent_policy = spec.make_policy(), spec.make_policy()
    fresh_policy.load_policy_state_dict(fresh.policy_state_dict())
    agent_policy.load_policy_state_dict(agent.policy_state_dict())
    np.testing.assert_array_equal(fresh_policy.act(obs, 0.0), agent_policy.act(obs, 0.0))
    for key, value in agent.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(parts["algorithm"][key], value)


def test_unsupported_values_are_rejected_and_leave_nothing_behind(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, sample_parts(1))
    with pytest.raises(TypeError, match="bad"):
        store.save(2, {"ok": {"x": 1}, "broken": {"bad": object()}})
    with pytest.raises(TypeError, match="bfloat16"):
        store.save(2, {"algorithm": {"w": torch.zeros(2, dtype=torch.bfloat16)}})
    with pytest.raises(ValueError, match="part name"):
        store.save(2, {"../escape": {"x": 1}})
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000001"]
    assert store.load_latest()[0] == 1


def test_keeps_only_the_last_k(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (100, 200, 300, 400):
        store.save(step, sample_parts(step))
    assert [step for step, _ in store.checkpoints()] == [300, 400]
    step, parts = store.load_latest()
    assert step == 400
    assert_parts_equal(parts, sample_parts(400))


def test_saving_a_step_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(5, sample_parts(1))
    store.save(5, sample_parts(2))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000005"]
    assert_parts_equal(store.load_latest()[1], sample_parts(2))


def test_steps_beyond_twelve_digits_sort_numerically(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    store.save(10**12, {"p": {"x": 1}})
    store.save(999_999_999_999, {"p": {"x": 0}})
    assert store.load_latest() == (10**12, {"p": {"x": 1}})


@pytest.fixture
def two_checkpoints(tmp_path) -> tuple[CheckpointStore, dict]:
    store = CheckpointStore(tmp_path)
    store.save(1, sample_parts(1))
    store.save(2, sample_parts(2))
    return store, sample_parts(1)


def assert_falls_back(store, previous, caplog, reason: str) -> None:
    with caplog.at_level(logging.WARNING, logger="actorlearner.checkpoint.store"):
        step, parts = store.load_latest()
    assert step == 1
    assert_parts_equal(parts, previous)
    [record] = [r for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert "ckpt-000000000002" in record.getMessage()
    assert reason in record.getMessage()


def test_truncated_file_falls_back_to_previous(two_checkpoints, caplog):
    store, previous = two_checkpoints
    path = store.directory / "ckpt-000000000002" / "replay.part"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])
    assert_falls_back(store, previous, caplog, "truncated")


def test_flipped_byte_falls_back_to_previous(two_checkpoints, caplog):
    store, previous = two_checkpoints
    path = store.directory / "ckpt-000000000002" / "algorithm.part"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # Inside tensor data: the file still parses, only the checksum knows.
    path.write_bytes(bytes(data))
    assert_falls_back(store, previous, caplog, "sha256")


def test_missing_manifest_is_skipped(two_checkpoints, caplog):
    store, previous = two_checkpoints
    (store.directory / "ckpt-000000000002" / "manifest.json").unlink()
    assert_falls_back(store, previous, caplog, "manifest.json is missing")


def test_missing_part_file_is_skipped(two_checkpoints, caplog):
    store, previous = two_checkpoints
    (store.directory / "ckpt-000000000002" / "learner.part").unlink()
    assert_falls_back(store, previous, caplog, "learner.part is missing")


def test_no_usable_checkpoint_gives_none(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    assert store.load_latest() is None
    store.save(1, sample_parts(1))
    (tmp_path / "ckpt-000000000001" / "manifest.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert store.load_latest() is None
    assert "manifest.json is unreadable" in caplog.text


def test_leftover_temp_dirs_are_removed_on_open(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, sample_parts(1))
    crashed = tmp_path / ".tmp-ckpt-000000000002-123-deadbeef"
    crashed.mkdir()
    (crashed / "algorithm.part").write_bytes(MAGIC)
    store = CheckpointStore(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000001"]
    assert store.load_latest()[0] == 1


def test_part_files_use_the_project_format_not_pickle(tmp_path):
    path = CheckpointStore(tmp_path).save(1, sample_parts(1))
    for part in ("algorithm", "replay", "learner"):
        data = (path / f"{part}.part").read_bytes()
        assert data.startswith(MAGIC)
        header_len = int.from_bytes(data[8:16], "little")
        header = msgpack.unpackb(data[16 : 16 + header_len])
        assert header.keys() == {"values", "tensors"}
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 1
    assert manifest["parts"]["replay"]["bytes"] == (path / "replay.part").stat().st_size
    assert len(manifest["parts"]["replay"]["sha256"]) == 64


class _Exploit:
    """Unpickling this would create ``target``: proof that pickle never runs."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return open, (str(self.target), "w")


def test_pickle_content_fails_cleanly_even_with_a_matching_manifest(two_checkpoints, caplog, tmp_path):
    store, previous = two_checkpoints
    target = tmp_path / "pwned"
    payload = pickle.dumps({"online.weight": _Exploit(target)})
    ckpt = store.directory / "ckpt-000000000002"
    (ckpt / "algorithm.part").write_bytes(payload)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["parts"]["algorithm"].update(bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    (ckpt / "manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(CheckpointError, match="bad magic"):
        read_part(ckpt / "algorithm.part")
    assert_falls_back(store, previous, caplog, "bad magic")
    assert not target.exists()


def test_crafted_header_cannot_force_a_huge_allocation(tmp_path):
    header = msgpack.packb({"values": {}, "tensors": [
        {"name": "x", "dtype": "float32", "shape": [2**40]}]})
    path = tmp_path / "bomb.part"
    path.write_bytes(MAGIC + len(header).to_bytes(8, "little") + header + b"\0" * 64)
    with pytest.raises(CheckpointError, match="truncated in tensor 'x'"):
        read_part(path)
    header = msgpack.packb({"values": {}, "tensors": [{"name": "x", "dtype": "object", "shape": [1]}]})
    path.write_bytes(MAGIC + len(header).to_bytes(8, "little") + header + b"\0" * 8)
    with pytest.raises(CheckpointError, match="unknown dtype"):
        read_part(path)
    path.write_bytes(MAGIC + (2**62).to_bytes(8, "little"))
    with pytest.raises(CheckpointError, match="header"):
        read_part(path)


def test_large_parts_are_not_held_twice_in_memory(tmp_path):
    size = 32 * 2**20
    big = {"obs": torch.ones(size // 4, dtype=torch.float32), "n": 1}
    tracemalloc.start()
    try:
        write_part(tmp_path / "big.part", big)
        _, write_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        loaded, _ = read_part(tmp_path / "big.part")
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert write_peak < size // 8  # Written straight from the tensor's memory.
    assert read_peak < size * 1.25  # Read straight into the final buffer.
    assert torch.equal(loaded["obs"], big["obs"])


def test_max_part_bytes_caps_each_tensor(tmp_path, caplog):
    CheckpointStore(tmp_path).save(1, {"replay": {"obs": torch.zeros(1000)}})
    with caplog.at_level(logging.WARNING):
        assert CheckpointStore(tmp_path, max_part_bytes=1000).load_latest() is None
    assert "over the cap" in caplog.text
    assert CheckpointStore(tmp_path, max_part_bytes=4000).load_latest()[0] == 1


def test_best_slot_keeps_the_highest_score(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.best_score is None and store.load_best() is None
    assert store.save_best({"policy": {"w": torch.ones(3)}}, 10.0, step=100)
    assert not store.save_best({"policy": {"w": torch.zeros(3)}}, 9.5, step=200)
    assert not store.save_best({"policy": {"w": torch.zeros(3)}}, 10.0, step=250)
    assert store.save_best({"policy": {"w": torch.full((3,), 2.0)}}, 12.5, step=300)

    reopened = CheckpointStore(tmp_path)
    assert reopened.best_score == 12.5
    score, parts = reopened.load_best()
    assert score == 12.5 and torch.equal(parts["policy"]["w"], torch.full((3,), 2.0))
    assert len(list((tmp_path / "best").iterdir())) == 1
    assert reopened.checkpoints() == []  # The best slot is not a training checkpoint.
    assert not reopened.save_best({"policy": {"w": torch.zeros(3)}}, 11.0)
    with pytest.raises(ValueError, match="finite"):
        reopened.save_best({"policy": {}}, float("nan"))


def test_corrupt_best_is_skipped(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    store.save_best({"policy": {"w": torch.ones(3)}}, 1.0)
    [best] = (tmp_path / "best").iterdir()
    (best / "policy.part").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        assert CheckpointStore(tmp_path).load_best() is None
    assert "skipping best checkpoint" in caplog.text


# --------------------------------------------------------------------------- the learner's checkpoints


def learner_config(directory, device: str = "cpu", **overrides) -> LearnerConfig:
    """A small learner. These tests insert much more than they train on (most never train), and are
    about what a checkpoint holds, not about pacing: the rate limiter is opened so no insert waits."""
    settings = dict(env="CartPole-v1", device=device, replay_capacity=4096, min_replay_size=64, batch_size=32,
                    rate_error_buffer=1e6, publish_every=5, eval_every=0, checkpoint_dir=str(directory),
                    algorithm_config=DQNConfig(hidden_sizes=(32, 32), target_update_period=7))
    return LearnerConfig(**{**settings, **overrides})


ALGORITHMS = {
    "dqn": {"env": "CartPole-v1"},
    "sac": {"env": "Pendulum-v1", "algorithm": "sac", "algorithm_config": SACConfig(hidden_sizes=(32, 32))},
    "td3": {"env": "Pendulum-v1", "algorithm": "td3", "algorithm_config": TD3Config(hidden_sizes=(32, 32))},
    "r2d2": {"env": "CartPole-v1", "algorithm": "r2d2",
             "algorithm_config": R2D2Config(sequence_length=6, overlap=2, burn_in=2, core_size=16, hidden_sizes=(16,),
                                            target_update_period=7)},
}
"""Learner settings per algorithm for the resume test: DQN and R2D2 (sequences) on CartPole, SAC and TD3 on
Pendulum."""


def ingest(learner: Learner, actor_id: str, seq: int, n: int = 32) -> bool:
    """Insert one batch of random transitions in the learner's item layout as ``actor_id``'s ``seq``."""
    rng = np.random.default_rng(seq)
    fields = {}
    for name, (shape, dtype) in learner.trainer.spec.transition_fields().items():
        values = rng.uniform(-1, 1, (n, *shape))
        fields[name] = (values if dtype.is_floating_point else values > 0).astype(wire.np_dtype(dtype))
    fields.update(reward=np.ones_like(fields["reward"]), discount=np.full_like(fields["discount"], 0.97))
    message = pb.ActorMessage.FromString(
        wire.encode_batch_message(seq, 0, n, wire.encode_batch(fields), wire.Codec.MSGPACK, priorities=[1.0] * n))
    record = learner.connect(pb.Hello(actor_id=actor_id, policy_version=-1))
    return learner.ingest(record, message.batch)


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def saved_seq_table(directory) -> dict:
    """The newest checkpoint's seq table, read without opening a store (a live learner owns the directory)."""
    for path in sorted(directory.glob("ckpt-*"), reverse=True):
        try:
            return read_part(path / "learner.part")[0]["seq_table"]
        except (OSError, CheckpointError):  # pruned or replaced while we read it
            continue
    return {}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_resumed_learner_continues_exactly_where_the_checkpoint_was(tmp_path, device, algorithm):
    """Networks, optimizers, targets, replay, priorities, limiter, counters, seq table and RNG all come back."""
    config = learner_config(tmp_path, device, **ALGORITHMS[algorithm])
    first = Learner(config)
    for seq in range(1, 9):
        assert ingest(first, "a", seq)
    for _ in range(12):  # past a target sync and a few published versions
        assert first.training.train_step()
    first.checkpoint()
    assert torch.get_rng_state().shape[0] > 0
    want_sample = first.replay.buffer.sample(32)
    assert first.training.train_step()
    want_params = {k: v.clone() for k, v in first.trainer.state_dict().items() if isinstance(v, torch.Tensor)}

    torch.manual_seed(12345)  # a fresh process would not share the first learner's generator state
    resumed = Learner(config)
    assert (resumed.version, resumed.updates) == (12 // 5, 12)
    assert resumed.replay.limiter.state_dict() == {"inserts": 8 * 32, "samples": 12 * 32, "shift": 0.0}
    assert len(resumed.replay) == 8 * 32 and resumed.broadcast.version == 12 // 5
    got_sample = resumed.replay.buffer.sample(32)
    assert torch.equal(got_sample.indices, want_sample.indices)  # same generator state, priorities and beta
    assert torch.equal(got_sample.weights, want_sample.weights)
    assert resumed.training.train_step()
    for key, value in resumed.trainer.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, want_params[key]), key
    assert resumed.replay.limiter.state_dict() == first.replay.limiter.state_dict()
    # The seq table came back: an acked batch resent after the restart is a duplicate, a new one is not.
    assert not ingest(resumed, "a", 8) and not ingest(resumed, "a", 3)
    assert ingest(resumed, "a", 9) and ingest(resumed, "b", 1)
    assert len(resumed.replay) == 10 * 32


def test_rng_states_round_trip_through_a_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal(), random.gauss(0, 1)  # leave a cached Gaussian in both
    CheckpointStore(tmp_path).save(1, {"rng": rng_state(torch.device("cpu"))})
    want = (torch.rand(4), np.random.rand(4), np.random.normal(), random.random(), random.gauss(0, 1))
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    load_rng_state(CheckpointStore(tmp_path).load_latest()[1]["rng"], torch.device("cpu"))
    got = (torch.rand(4), np.random.rand(4), np.random.normal(), random.random(), random.gauss(0, 1))
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2:] == want[2:]


def test_checkpoints_are_written_on_schedule_while_training_waits(tmp_path):
    """Acked batches reach disk even before min_replay_size allows the first update."""
    learner = Learner(learner_config(tmp_path, checkpoint_every=0.2, min_replay_size=1000))
    learner.start()
    try:
        assert ingest(learner, "a", 5)

        assert wait_for(lambda: saved_seq_table(tmp_path).get("a") == 5, 10)
        assert learner.updates == 0
    finally:
        learner.stop()


def test_a_failing_checkpoint_is_logged_and_training_goes_on(tmp_path, caplog):
    learner = Learner(learner_config(tmp_path / "ckpt", checkpoint_every=0.2))
    for seq in range(1, 5):
        ingest(learner, "a", seq)
    (tmp_path / "ckpt").rmdir()
    (tmp_path / "ckpt").write_text("not a directory")  # every save now fails with an OSError
    with caplog.at_level(logging.ERROR, logger="actorlearner.learner.learner"):
        learner.start()
        try:
            assert wait_for(lambda: "checkpoint failed" in caplog.text, 10)
            updates = learner.updates
            assert wait_for(lambda: learner.updates > updates + 10, 10)
            (tmp_path / "ckpt").unlink()
            (tmp_path / "ckpt").mkdir()
            assert wait_for(lambda: saved_seq_table(tmp_path / "ckpt").get("a") == 4, 10)
        finally:
            learner.stop()


def test_without_the_replay_the_limiter_starts_afresh(tmp_path):
    config = learner_config(tmp_path, checkpoint_replay=False)
    first = Learner(config)
    for seq in range(1, 4):
        ingest(first, "a", seq)
    assert first.training.train_step()
    first.checkpoint()
    resumed = Learner(config)
    assert len(resumed.replay) == 0 and resumed.updates == 1
    assert resumed.replay.limiter.state_dict() == {"inserts": 0, "samples": 0, "shift": 0.0}  # min_replay_size applies again
    assert not resumed.replay.limiter.can_sample()
    assert not ingest(resumed, "a", 3)  # acked before the checkpoint: still a duplicate


def test_broken_checkpoints_are_moved_aside_so_newer_saves_survive_pruning(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (5, 6):
        store.save(step, sample_parts(step))
        (tmp_path / f"ckpt-{step:012d}" / "replay.part").write_bytes(b"junk")
    with caplog.at_level(logging.WARNING):
        assert store.load_latest() is None
        store.save(0, sample_parts(0))  # a learner starting afresh numbers from 0 again
    assert "aside to ckpt-000000000006.broken" in caplog.text
    store.save(1, sample_parts(1))
    assert [step for step, _ in store.checkpoints()] == [0, 1]
    assert store.load_latest()[0] == 1
    assert sorted(p.name for p in tmp_path.glob("*.broken")) == ["ckpt-000000000005.broken",
                                                                 "ckpt-000000000006.broken"]


def test_evaluating_leaves_the_trainers_generator_alone(tmp_path):
    """Evaluations run on their own thread: they must not reseed or advance the generator replay sampling uses."""
    learner = Learner(learner_config(tmp_path, eval_episodes=2, eval_envs=2))
    before = torch.get_rng_state()
    learner.evaluation.evaluate()
    assert torch.equal(torch.get_rng_state(), before)


# --------------------------------------------------------------------------- chunked tensors; checkpoints during ingest


class Chunks:
    """A chunked tensor over ``tensor``, ``rows`` rows per chunk; it may claim another dtype or shape."""

    def __init__(self, tensor: torch.Tensor, rows: int, dtype: torch.dtype | None = None,
                 shape: tuple[int, ...] | None = None):
        self.tensor, self.rows = tensor, rows
        self.dtype, self.shape = dtype or tensor.dtype, shape or tuple(tensor.shape)

    def chunks(self):
        for start in range(0, self.tensor.shape[0], self.rows):
            yield self.tensor[start:start + self.rows]


def test_chunked_tensors_are_written_as_they_come_into_the_same_bytes(tmp_path):
    obs = torch.arange(70 * 3, dtype=torch.float32).reshape(70, 3)
    empty = torch.zeros(0, 2, dtype=torch.uint8)
    size, sha256 = write_part(tmp_path / "chunked.part", {"obs": Chunks(obs, 16), "empty": Chunks(empty, 4), "n": 3})
    assert (size, sha256) == write_part(tmp_path / "plain.part", {"obs": obs, "empty": empty, "n": 3})
    loaded, _ = read_part(tmp_path / "chunked.part")
    assert torch.equal(loaded["obs"], obs) and loaded["empty"].shape == (0, 2) and loaded["n"] == 3


@pytest.mark.parametrize("bad,message", [
    (Chunks(torch.zeros(10, 2), 3, shape=(12, 2)), "chunks hold 10 rows"),
    (Chunks(torch.zeros(10, 2), 3, shape=(10, 3)), "does not fit"),
    (Chunks(torch.zeros(10, 2), 3, dtype=torch.float64), "does not fit"),
])
def test_chunks_that_do_not_make_their_shape_leave_no_checkpoint(tmp_path, bad, message):
    store = CheckpointStore(tmp_path)
    store.save(1, sample_parts(1))
    with pytest.raises(ValueError, match=message):
        store.save(2, {"replay": {"obs": bad}})
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000001"]


def tagged_batch(actor: int, seq: int, n: int = 32) -> pb.TrajectoryBatch:
    """A CartPole-shaped batch whose rows say where they come from: obs = (actor, seq, row, 0)."""
    obs = np.stack([np.full(n, actor), np.full(n, seq), np.arange(n), np.zeros(n)], 1).astype(np.float32)
    fields = {"obs": obs, "action": np.full(n, seq % 2), "reward": np.full(n, seq, np.float32),
              "discount": np.full(n, 0.97, np.float32), "next_obs": obs + 0.5}
    return pb.ActorMessage.FromString(wire.encode_batch_message(
        seq, 0, n, wire.encode_batch(fields), wire.Codec.MSGPACK, priorities=[seq % 7 + 1.0] * n)).batch


class Ingester(threading.Thread):
    """Ingests actor "b"'s tagged batches (seq 1, 2, ...) as far as it is allowed, until stopped. Bounded, so
    that a checkpoint slower to start than the ingester (a cold numba cache, a busy machine) never finds the
    rate limiter full and the ingester stuck: then no read could see the inserts it waits for."""

    def __init__(self, learner: Learner, allowed: int):
        super().__init__(daemon=True)
        self.learner, self.stored, self.error = learner, 0, None
        self.allowed = allowed
        self.changed = threading.Condition()
        self.stop = threading.Event()

    def allow(self, more: int) -> None:
        with self.changed:
            self.allowed += more
            self.changed.notify_all()

    def run(self) -> None:
        stream = self.learner.connect(pb.Hello(actor_id="b", policy_version=-1))
        try:
            while True:
                with self.changed:
                    self.changed.wait_for(lambda: self.stored < self.allowed or self.stop.is_set())
                if self.stop.is_set():
                    return
                assert self.learner.ingest(stream, tagged_batch(1, self.stored + 1))
                self.stored += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e


def pause_each_chunk_read(monkeypatch, learner: Learner, ingester: Ingester, batches: int) -> list[str]:
    """Fault injection: every chunk the checkpoint reads from its replay snapshot first waits until
    ``ingester`` stored ``batches`` more. Returns, per read, the checkpoint directory's entries then
    as (is a temp dir, has a manifest)."""
    seen: list[list[tuple[bool, bool]]] = []
    take_snapshot = learner.replay.buffer.snapshot

    def snapshot(*args, **kwargs):
        taken = take_snapshot(*args, **kwargs)
        read = taken.read

        def read_after_inserts(*read_args):
            target = ingester.stored + batches
            ingester.allow(batches)
            assert wait_for(lambda: ingester.stored >= target or ingester.error is not None, 60), "ingest is stuck"
            seen.append([(p.name.startswith(".tmp-"), (p / "manifest.json").exists())
                         for p in learner.checkpoints.store.directory.iterdir()])
            return read(*read_args)

        taken.read = read_after_inserts
        return taken

    monkeypatch.setattr(learner.replay.buffer, "snapshot", snapshot)
    return seen


def checkpoint_while_ingesting(monkeypatch, learner: Learner, batches_per_read: int):
    """Checkpoint while actor "b" keeps ingesting, each chunk read waiting for ``batches_per_read`` more
    inserts. Returns :func:`pause_each_chunk_read`'s record and how many batches "b" stored in all."""
    ingester = Ingester(learner, allowed=3)
    seen = pause_each_chunk_read(monkeypatch, learner, ingester, batches=batches_per_read)
    ingester.start()
    try:
        assert wait_for(lambda: ingester.stored >= 3 or ingester.error is not None, 60)
        learner.checkpoint()
    finally:
        ingester.stop.set()
        ingester.allow(0)  # wakes it to see the stop
        ingester.join()
    assert ingester.error is None
    return seen, ingester.stored


def test_ingest_goes_on_while_a_checkpoint_is_being_written(tmp_path, monkeypatch):
    """Ordering, not timing: each chunk read waits for 3 inserts, which must get through meanwhile."""
    learner = Learner(learner_config(tmp_path))
    for seq in range(1, 9):
        assert ingest(learner, "a", seq)
    seen, stored = checkpoint_while_ingesting(monkeypatch, learner, batches_per_read=3)
    # 7 columns, one chunk each, every read made while the checkpoint sat unfinished in its temp dir.
    assert seen == [[(True, False)]] * 7
    acked = saved_seq_table(tmp_path)
    assert acked["a"] == 8 and acked["b"] >= 3 and stored >= acked["b"] + 7 * 3


def test_a_checkpoint_taken_during_ingest_holds_exactly_the_batches_its_seq_table_has(tmp_path, monkeypatch):
    """Inserts wrap over the whole buffer while it is written; the file still matches its seq table."""
    capacity, n = 2048, 32
    config = learner_config(tmp_path, replay_capacity=capacity)
    learner = Learner(config)
    filler = learner.connect(pb.Hello(actor_id="a", policy_version=-1))
    for seq in range(1, capacity // n + 1):
        assert learner.ingest(filler, tagged_batch(0, seq))
    _, stored = checkpoint_while_ingesting(monkeypatch, learner, batches_per_read=10)  # 7 x 10 x 32: past capacity

    _, parts = CheckpointStore(tmp_path).load_latest()
    acked, replay = parts["learner"]["seq_table"], parts["replay"]
    b = acked["b"]
    assert acked["a"] == capacity // n and b >= 3 and stored >= b + 70
    sent = [(0, seq, row) for seq in range(1, acked["a"] + 1) for row in range(n)]
    sent += [(1, seq, row) for seq in range(1, b + 1) for row in range(n)]
    assert replay["inserted"] == len(sent) == parts["learner"]["inserts"]  # the limiter's count as of that instant
    order = torch.argsort(replay["keys"])
    assert torch.equal(replay["keys"][order], torch.arange(len(sent) - capacity, len(sent)))
    obs = replay["field.obs"][order]
    assert obs[:, :3].tolist() == [list(map(float, item)) for item in sent[-capacity:]]
    assert torch.equal(replay["field.next_obs"][order], obs + 0.5)
    assert torch.equal(replay["field.reward"][order], obs[:, 1])
    assert torch.equal(replay["field.action"][order], obs[:, 1].long() % 2)
    want_priorities = (obs[:, 1].double() % 7 + 1 + learner.replay.buffer.eps) ** config.alpha
    torch.testing.assert_close(replay["priorities"][order], want_priorities, rtol=1e-12, atol=0)

    # Exactly once across a restore: what the table acked is a duplicate, the next seq is new.
    resumed = Learner(config)
    stream = resumed.connect(pb.Hello(actor_id="b", policy_version=-1))
    assert len(resumed.replay) == capacity
    assert not resumed.ingest(stream, tagged_batch(1, b))
    assert resumed.ingest(stream, tagged_batch(1, b + 1))
