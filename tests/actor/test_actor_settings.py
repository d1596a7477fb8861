"""An actor applies every Welcome's settings: a learner restarted with others, a second session's
window, and weights or configs it cannot apply (exit 2, one ERROR line, no traceback)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from concurrent import futures

import grpc
import gymnasium as gym
import numpy as np
import pytest
from procs import (FAST_LEARNER, NOT_TRAINING, PACED_ENV, free_port, start_actor, start_learner, status, stop,
                   wait_until)

from actorlearner import wire
from actorlearner.actor.actor import Actor
from actorlearner.actor.batching import cut
from actorlearner.algorithms import make_spec
from actorlearner.algorithms.nstep import NStepAssembler
from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import ActorConfig
from actorlearner.learner.spec import field_specs
from actorlearner.v1 import learner_pb2 as pb

# The replacement differs in n-step, gamma, batch size, window, codec, epsilon, actor count and network.
FIRST = [*FAST_LEARNER, "--dqn-n-step", "3", "--dqn-gamma", "0.99", "--actor-batch-size", "32",
         "--max-unacked", "4", "--dqn-epsilon-base", "0.4", "--num-actors", "1"]
SECOND = [*FAST_LEARNER, "--dqn-n-step", "2", "--dqn-gamma", "0.9", "--actor-batch-size", "40",
          "--max-unacked", "3", "--dqn-epsilon-base", "0.2", "--num-actors", "3", "--dqn-hidden-sizes", "48,24",
          "--codec", "msgpack+zlib"]
# Made under the first learner: its window (resent), a batch waiting for room, the close-out of the rest.
OLD_BATCHES_AT_MOST = 4 + 1 + 2


def grows_in_batches_of(port: int, size: int) -> bool:
    """Whether the replay grew by exactly ``size`` per inserted batch between two snapshots
    (False too for a snapshot that read the buffer and the counter mid-insert; poll it)."""
    before = status(port)
    after = wait_until(lambda: (s := status(port)).inserted >= before.inserted + 2 and s, 30, "two more batches")
    return after.buffer_size - before.buffer_size == (after.inserted - before.inserted) * size


def run_learner(args: list[str], port: int) -> tuple[subprocess.Popen, str]:
    learner, _ = start_learner(*args, port=port)
    return learner, status(port).learner_id


class StderrLines:
    """The stderr of a child process, line by line, collected on a thread."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(l.decode() for l in proc.stderr), daemon=True)
        self._thread.start()

    def matching(self, pattern: str) -> list[str]:
        return [line for line in list(self.lines) if re.search(pattern, line)]

    def text(self, timeout: float = 10) -> str:
        self._thread.join(timeout)
        return "".join(self.lines)


def test_a_new_assembler_continues_a_flushed_ones_episodes_and_still_skips_an_autoreset_step():
    box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    assembler = NStepAssembler(2, 3, 0.5, box)
    ones, no, obs = np.ones(2), np.zeros(2, bool), np.zeros((2, 1), np.float32)
    assert assembler.push(obs, np.zeros(2, np.int64), ones, no, no, obs + 1) is None
    ended = assembler.push(obs + 1, np.zeros(2, np.int64), ones, np.array([True, False]), no, obs + 2)
    assert list(ended["discount"]) == [0.0, 0.0]  # env 0 terminated: its two windows

    flushed = assembler.flush()
    previous, assembler = assembler, NStepAssembler(2, 2, 0.9, box)
    assembler.inherit(previous)
    assert list(flushed["reward"]) == [1.5, 1.0] and list(flushed["discount"]) == [0.25, 0.5]  # env 1, truncated
    assert (flushed["next_obs"] == 2).all() and (assembler.n_step, assembler.gamma) == (2, 0.9)
    # Env 0's next step is its autoreset: nothing from it, in the new assembler too.
    assert assembler.push(obs + 2, np.zeros(2, np.int64), ones, no, no, obs + 3) is None
    out = assembler.push(obs + 3, np.zeros(2, np.int64), ones, no, no, obs + 4)
    assert list(out["obs"][:, 0]) == [2.0] and list(out["discount"]) == [pytest.approx(0.81)]
    assert list(assembler.pending) == [1, 1]


def test_actor_process_follows_a_learner_restarted_with_other_settings(tmp_path):
    port = free_port()
    first, first_id = run_learner([*FIRST, "--checkpoint-dir", str(tmp_path)], port)
    actor = start_actor(port, "follower", "--reconnect-max", "1", "--env", PACED_ENV, stderr=subprocess.PIPE)
    log = StderrLines(actor)
    second = None
    try:
        wait_until(lambda: (s := status(port)).policy_version >= 1 and s.inserted >= 3, 60,
                   "the first learner training")
        assert log.matching(f"applied settings from learner {first_id}: batch_size=32 max_unacked=4")
        assert stop(first) == [0]
        first_version = CheckpointStore(tmp_path).load_latest()[1]["learner"]["version"]  # its final one

        second, second_id = run_learner(SECOND, port)
        applied = wait_until(lambda: log.matching(f"applied settings from learner {second_id}"), 60,
                             "the actor to apply the second learner's settings")[0]
        assert ("batch_size=40 max_unacked=3 codec=msgpack+zlib actor_priorities=True "
                "exploration=0.2 (actor 0 of 3)") in applied
        assert re.search(r'dqn network built from .*"gamma": 0.9, "hidden_sizes": \[48, 24\].*"n_step": 2', applied)
        # After the first learner's batches (resent window, close-out), only batches of the new size.
        wait_until(lambda: status(port).inserted > OLD_BATCHES_AT_MOST, 60, "the actor streaming again")
        wait_until(lambda: grows_in_batches_of(port, 40), 60, "the replay to grow in batches of 40")
        # It runs versions only the second learner made: the new network with its weights.
        wait_until(lambda: (s := status(port)).updates > 50 and s.actors[0].policy_version > first_version, 90,
                   f"training and the actor running a version above the first learner's last ({first_version})")
        assert actor.poll() is None, "the actor process was never restarted"
    finally:
        codes = stop(actor, *([second] if second else []))
        first.kill()
    assert codes == [0, 0]
    assert "Traceback" not in log.text()


def test_in_process_actor_rebuilds_assembler_epsilon_batches_window_and_network_on_a_new_welcome():
    port = free_port()
    # Learners that store batches and never train: weights come with each Welcome, and nothing here trains.
    first, first_id = run_learner([*FIRST, *NOT_TRAINING], port)
    actor = Actor(ActorConfig(learner=f"127.0.0.1:{port}", actor_id="in-process", num_envs=2, reconnect_max=1.0,
                              env=PACED_ENV))
    runner = threading.Thread(target=actor.run, daemon=True)
    runner.start()
    second = None
    try:
        wait_until(lambda: actor.session and actor.session.learner_id == first_id and actor.policy_version >= 0
                   and status(port).inserted >= 2, 60, "the first session streaming")
        assert (actor.assembler.n_step, actor.assembler.gamma) == (3, pytest.approx(0.99))
        assert actor.exploration == pytest.approx(0.4) and actor.link.max_unacked == 4
        first_network = actor.policy
        assert first_network.policy_state_dict()["encoder.mlp.0.weight"].shape == (32, 4)
        assert stop(first) == [0]

        second, second_id = run_learner([*SECOND, *NOT_TRAINING], port)
        wait_until(lambda: actor.session.learner_id == second_id and actor.policy_version >= 0, 60,
                   "the second session's settings and weights")
        assert (actor.assembler.n_step, actor.assembler.gamma) == (2, pytest.approx(0.9))
        assert actor.exploration == pytest.approx(0.2) and actor.link.max_unacked == 3
        assert actor.session.settings.batch_size == 40
        assert actor.policy is not first_network and actor.policy is actor.session.policy
        assert actor.policy.policy_state_dict()["encoder.mlp.0.weight"].shape == (48, 4)
        wait_until(lambda: status(port).inserted > OLD_BATCHES_AT_MOST, 60, "the actor streaming again")
        wait_until(lambda: grows_in_batches_of(port, 40), 60, "the replay to grow in batches of 40")
        assert actor.link.error is None and runner.is_alive()
    finally:
        actor.stop()
        runner.join(30)
        stop(*([second] if second else []))
        first.kill()
    assert not runner.is_alive()


# -- scripted peers: real gRPC servers on 127.0.0.1 that answer Connect from a script ----------

CARTPOLE = gym.make("CartPole-v1")
CARTPOLE_FIELDS = field_specs(make_spec("dqn", CARTPOLE.observation_space, CARTPOLE.action_space)
                              .transition_fields())


def settings(hidden_sizes: list[int], n_step: int = 3, gamma: float = 0.99, **overrides) -> pb.Settings:
    config = {"hidden_sizes": hidden_sizes, "n_step": n_step, "gamma": gamma, "epsilon_base": 0.4}
    values = {"batch_size": 16, "max_unacked": 4, "codec": pb.CODEC_MSGPACK, "actor_priorities": True,
              "num_actors": 1, "actor_index": 0, "max_message_bytes": 64 << 20, "algorithm": "dqn",
              "algorithm_config": json.dumps(config)}
    return pb.Settings(**{**values, **overrides})


def welcome(learner_id: str, version: int, session_settings: pb.Settings) -> pb.LearnerMessage:
    """A Welcome with the batch fields of DQN on CartPole, as a learner sends it."""
    return pb.LearnerMessage(welcome=pb.Welcome(learner_id=learner_id, policy_version=version,
                                                settings=session_settings, batch_fields=CARTPOLE_FIELDS))


def weights(version: int, hidden_sizes: list[int]) -> pb.LearnerMessage:
    """A whole PolicyUpdate of a DQN network with ``hidden_sizes`` for CartPole."""
    network = make_spec("dqn", CARTPOLE.observation_space, CARTPOLE.action_space,
                        {"hidden_sizes": tuple(hidden_sizes)}).make_policy()
    payload = wire.encode_state_dict(network.policy_state_dict())
    return pb.LearnerMessage(policy_update=pb.PolicyUpdate(version=version, chunk_index=0, chunk_count=1,
                                                           total_bytes=len(payload), payload=payload))


class ScriptedLearner:
    """Answers the n-th Connect stream with ``scripts[n](hello, requests, context)``, a generator of LearnerMessages."""

    def __init__(self, *scripts):
        self.scripts = list(scripts)
        self.hellos: list[pb.Hello] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.stream_stream_rpc_method_handler(self._connect, request_deserializer=pb.ActorMessage.FromString,
                                                        response_serializer=pb.LearnerMessage.SerializeToString)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("actorlearner.v1.Learner", {"Connect": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _connect(self, requests, context):
        hello = next(requests).hello
        self.hellos.append(hello)
        yield from self.scripts.pop(0)(hello, requests, context)

    def close(self) -> None:
        self.server.stop(0)


def batches(requests):
    """The TrajectoryBatches among an actor's messages."""
    return (message.batch for message in requests if message.WhichOneof("kind") == "batch")


def test_a_new_welcome_keeps_the_window_and_closes_out_the_old_sessions_transitions():
    """Unacked batches are resent byte for byte with their seqs; what the old session had collected goes
    out as its last batches (old codec, at most its size, its n-step discounts); then only new batches."""
    first_settings = settings([32, 32])
    second_settings = settings([48, 24], n_step=2, gamma=0.5, batch_size=24, max_unacked=3,
                               codec=pb.CODEC_MSGPACK_ZLIB)
    first_session: list[pb.TrajectoryBatch] = []
    second_session: list[pb.TrajectoryBatch] = []

    def first(hello, requests, context):
        yield welcome("first", 7, first_settings)
        yield weights(7, [32, 32])
        for batch in batches(requests):
            first_session.append(batch)
            if len(first_session) <= 2:  # acked; the next four fill the window of 4, unacked
                yield pb.LearnerMessage(ack=pb.Ack(seq=batch.seq, accepted=True))
            if len(first_session) == 6:
                context.abort(grpc.StatusCode.UNAVAILABLE, "learner restarting")

    def second(hello, requests, context):  # restarted with other settings, and versions that start lower
        yield welcome("second", 2, second_settings)
        yield weights(2, [48, 24])
        for batch in batches(requests):
            second_session.append(batch)
            yield pb.LearnerMessage(ack=pb.Ack(seq=batch.seq, accepted=True))

    learner = ScriptedLearner(first, second)
    actor = Actor(ActorConfig(learner=f"127.0.0.1:{learner.port}", actor_id="windowed", num_envs=2))
    runner = threading.Thread(target=actor.run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: sum(b.codec == pb.CODEC_MSGPACK_ZLIB for b in second_session) >= 3, 60,
                   "three batches of the second session")
    finally:
        actor.stop()
        runner.join(30)
        learner.close()
    assert not runner.is_alive() and actor.link.error is None

    resent = first_session[2:]
    assert [b.SerializeToString() for b in second_session[:4]] == [b.SerializeToString() for b in resent]
    assert learner.hellos[1].policy_version == 7  # what its window was made with: the new learner must accept it
    fresh = second_session[4:]
    seqs = [b.seq for b in first_session + fresh]
    assert seqs == sorted(set(seqs)), "seqs rise and none is used twice"
    old_codec = [b for b in fresh if b.codec == pb.CODEC_MSGPACK]
    new_codec = fresh[len(old_codec):]
    assert old_codec and fresh[:len(old_codec)] == old_codec, "the close-out comes first"
    assert all(b.codec == pb.CODEC_MSGPACK_ZLIB and b.num_transitions == 24 and b.policy_version == 2
               for b in new_codec)
    assert all(b.num_transitions <= 16 and b.policy_version == 7 for b in old_codec)

    def discounts(batch_list, codec):
        fields = actor.policy.spec.transition_fields()
        return np.concatenate([wire.decode_batch(b.payload, codec, fields, b.num_transitions)["discount"]
                               for b in batch_list])

    gamma = 0.99  # algorithm_config carries it as a JSON double
    assert set(discounts(old_codec, pb.CODEC_MSGPACK)) <= {np.float32(0.0), *(np.float32(gamma**k) for k in (1, 2, 3))}
    assert set(discounts(new_codec, pb.CODEC_MSGPACK_ZLIB)) <= {np.float32(0.0), np.float32(0.5), np.float32(0.25)}


def test_weights_withheld_for_a_version_the_actor_holds_of_another_network_are_asked_for_again():
    """A learner sends no PolicyUpdate for the version the Hello names; if it is of another network
    (a restart with other settings that reached the same version number), the actor asks with -1."""

    third_stream: list[pb.TrajectoryBatch] = []

    def script(hidden_sizes: list[int], with_weights: bool, then_abort: bool):
        def session(hello, requests, context):
            received = third_stream if len(learner.hellos) == 3 else []
            yield welcome(f"learner-{hidden_sizes}", 3, settings(hidden_sizes))
            if with_weights:
                yield weights(3, hidden_sizes)
            for batch in batches(requests):
                received.append(batch)
                yield pb.LearnerMessage(ack=pb.Ack(seq=batch.seq, accepted=True))
                if then_abort:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "learner restarting")
        return session

    learner = ScriptedLearner(script([32, 32], with_weights=True, then_abort=True),
                              script([48, 24], with_weights=False, then_abort=False),  # "you hold version 3"
                              script([48, 24], with_weights=True, then_abort=False))
    actor = Actor(ActorConfig(learner=f"127.0.0.1:{learner.port}", actor_id="withheld", num_envs=2))
    runner = threading.Thread(target=actor.run, daemon=True)
    runner.start()
    try:
        # More than a resent window (4) and a close-out (2): batches made with the new network too.
        wait_until(lambda: len(third_stream) >= 8, 60, "the actor streaming on the third stream")
    finally:
        actor.stop()
        runner.join(30)
        learner.close()
    assert [hello.policy_version for hello in learner.hellos] == [-1, 3, -1]
    assert actor.session.learner_id == "learner-[48, 24]" and actor.policy_version == 3
    assert actor.policy.policy_state_dict()["encoder.mlp.0.weight"].shape == (48, 4) and actor.link.error is None


def hostile_weights(hello, requests, context):
    """Welcome describes a [32, 32] network; the weights that follow are of a [64, 64] one."""
    yield welcome("hostile", 1, settings([32, 32]))
    yield weights(1, [64, 64])
    while context.is_active():  # keep the stream open until the actor goes
        threading.Event().wait(0.1)


def hostile_config(hello, requests, context):
    """An algorithm_config the actor cannot build a network from."""
    yield welcome("hostile", 1, settings([32, 32], algorithm_config='{"hidden_sizes": [32], "layer_norm": true}'))
    while context.is_active():
        threading.Event().wait(0.1)


@pytest.mark.parametrize("script, names", [
    (hostile_weights, ["does not fit the network", "'encoder.mlp.0.weight' is float32[64, 4], expected float32[32, 4]"]),
    (hostile_config, ["settings this actor cannot apply", "layer_norm"]),
])
def test_actor_exits_2_with_one_error_line_on_settings_or_weights_it_cannot_apply(script, names):
    learner = ScriptedLearner(script)
    actor = start_actor(learner.port, "victim", stderr=subprocess.PIPE)
    log = StderrLines(actor)
    try:
        code = actor.wait(60)
    finally:
        actor.kill()
        learner.close()
    stderr = log.text()
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert code == 2, stderr
    assert len(errors) == 1 and all(name in errors[0] for name in names), stderr
    assert "hostile" in errors[0] and "Traceback" not in stderr


def test_a_batch_spanning_a_policy_change_carries_the_oldest_version_of_its_transitions():
    """learner.proto: the learner's staleness bound must never see a batch as newer than it is."""
    blocks = [{"reward": np.arange(3.0)}, {"reward": np.arange(3.0, 7.0)}, {"reward": np.arange(7.0, 9.0)}]
    versions = [4, 5, 6]
    head, rest, rest_versions = cut(blocks, versions, 5)  # the cut falls inside the version-5 block
    assert head["reward"].tolist() == [0, 1, 2, 3, 4] and rest[0]["reward"].tolist() == [5, 6, 7, 8]
    assert rest_versions == [5]  # the leftover starts with version-5 transitions, not the newest (6)
    assert cut(blocks, versions, 7)[2] == [6] and cut(blocks, versions, 9)[1:] == ([], [])
