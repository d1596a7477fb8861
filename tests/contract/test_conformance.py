"""Conformance: an actor built from learner.proto's text and docs/policy-network.md alone (conformance_actor.py;
nothing from actorlearner) runs whole sessions against real learner processes over raw gRPC: a state-dict
policy, an ONNX policy, frame-stacked batches, priorities, and Shutdown."""

from __future__ import annotations

import json
import re
import signal
import zlib

import grpc
import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
from conformance_actor import (
    Client, Player, Proto, QNet, Stream, apex_epsilon, decode, encode, field_specs, leaves, next_policy, poll,
)
from procs import start_learner, stop

CARTPOLE = ["--env", "CartPole-v1", "--eval-every", "0", "--dqn-hidden-sizes", "32,32", "--replay-capacity", "5000",
            "--batch-size", "32", "--publish-every", "2", "--actor-batch-size", "64", "--max-unacked", "3",
            "--rate-error-buffer", "5000"]
MIN_REPLAY = 300  # the CartPole learner trains past this many transitions; the ONNX session alone sends fewer


@pytest.fixture(scope="module")
def proto(tmp_path_factory) -> Proto:
    return Proto(tmp_path_factory.mktemp("proto"))


@pytest.fixture(scope="module")
def cartpole(proto):
    """One CartPole learner for the state-dict and the ONNX sessions: a Client to it."""
    proc, port = start_learner(*CARTPOLE, "--min-replay-size", str(MIN_REPLAY))
    client = Client(proto, port)
    yield client
    client.close()
    stop(proc)


def hello(proto: Proto, spec, actor_id: str, policy_format: str = ""):
    return proto.Hello(actor_id=actor_id, protocol_version=proto.enum_value("Protocol", "PROTOCOL_VERSION"),
                       env_spec=spec.env_spec, algorithm=spec.algorithm, policy_version=-1, policy_format=policy_format)


def state_dict(spec, payload: bytes) -> dict[str, np.ndarray]:
    """A PolicyUpdate's state dict, checked against LearnerSpec.policy."""
    state = decode(payload)
    assert {name: (a.dtype.name, a.shape) for name, a in state.items()} == field_specs(spec.policy)
    return state


def onnx_model(payload: bytes) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(payload, providers=["CPUExecutionProvider"])


def same_greedy_actions(net: QNet, model: onnxruntime.InferenceSession, obs: dict[str, np.ndarray]) -> None:
    """The doc's network and the learner's ONNX model choose the same actions (rows without a near tie)."""
    expected = model.run(["action"], obs)[0]
    assert expected.dtype == np.dtype(net.dtype) and expected.shape == (len(expected), *net.shape)
    top_two = [np.sort(q_d, axis=1)[:, -2:] for q_d in net.q(obs)]
    clear = np.all([top[:, 1] - top[:, 0] > 1e-4 for top in top_two], axis=0)
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(net.greedy(obs)[clear], expected[clear])


def batch_message(proto: Proto, welcome, seq: int, version: int, fields: dict[str, np.ndarray],
                  priorities: np.ndarray | None = None):
    """A TrajectoryBatch of exactly the Welcome's batch fields, in its codec; ``priorities`` None leaves them out."""
    assert {name: (a.dtype.name, a.shape[1:]) for name, a in fields.items()} == field_specs(welcome.batch_fields)
    payload = encode(fields)
    if welcome.settings.codec == proto.enum_value("Codec", "CODEC_MSGPACK_ZLIB"):
        payload = zlib.compress(payload)
    batch = proto.TrajectoryBatch(seq=seq, policy_version=version, num_transitions=len(fields["action"]),
                                  payload=payload, codec=welcome.settings.codec)
    if priorities is not None:
        assert np.all(np.isfinite(priorities)) and np.all(priorities >= 0)
        batch.priorities.extend(priorities.tolist())
    return proto.ActorMessage(batch=batch)


def send_all(stream: Stream, welcome, messages) -> list[int]:
    """Send the batch ``messages``, never more than ``Settings.max_unacked`` unacked; the acked seqs in order,
    each Ack accepted and not a duplicate."""
    pending, acked = set(), []

    def take_ack():
        ack = stream.next("ack").ack
        assert ack.seq in pending and ack.accepted and ack.reason == "", (ack, sorted(pending))
        pending.remove(ack.seq)
        acked.append(ack.seq)

    for message in messages:
        while len(pending) >= welcome.settings.max_unacked:
            take_ack()
        stream.send(message)
        pending.add(message.batch.seq)
    while pending:
        take_ack()
    return acked


def with_priorities(proto: Proto, welcome, net: QNet, version: int, seq: int, fields, obs, next_obs):
    """A batch with the initial priorities of the proto's "Priorities" paragraph, from ``net``."""
    priorities = net.priorities({"obs": obs}, fields["action"], fields["reward"], fields["discount"], {"obs": next_obs})
    return batch_message(proto, welcome, seq, version, fields, priorities)


def refused(client: Client, hello_message, message) -> tuple[grpc.StatusCode, str]:
    """How a fresh stream that sends ``message`` ends: (code, details)."""
    stream = client.connect(hello_message)
    stream.next("welcome")
    stream.send(message)
    return stream.wait_end()


def test_the_proto_states_one_protocol_version(proto):
    version = proto.enum_value("Protocol", "PROTOCOL_VERSION")
    assert version == 2
    header = proto.text.split("syntax =")[0]
    assert int(re.search(r"PROTOCOL_VERSION = (\d+)", header).group(1)) == version
    stated = re.findall(r"PROTOCOL_VERSION\s*=\s*(\d+)|currently\s+(\d+)|speaks\s+(\d+)", proto.text)
    assert {int(n) for match in stated for n in match if n} == {version}, stated
    assert max(int(n) for n in re.findall(r"Version (\d+):", proto.text)) == version


def test_a_state_dict_session_trains_the_learner_and_acts_with_each_policy(proto, cartpole):
    spec = cartpole.spec()
    assert spec.protocol_version == proto.enum_value("Protocol", "PROTOCOL_VERSION") and spec.algorithm == "dqn"
    config = json.loads(spec.algorithm_config)
    stream = cartpole.connect(hello(proto, spec, "conformance-state-dict"))
    welcome = stream.next("welcome").welcome
    assert field_specs(welcome.batch_fields) == field_specs(spec.batch_fields)
    assert welcome.settings.actor_priorities and welcome.settings.algorithm == "dqn"
    version, payload = next_policy(stream)
    assert version == welcome.policy_version >= 0
    net = QNet(spec.env_spec, config, state_dict(spec, payload))

    # The learner's ONNX model of the same version (it trains only past MIN_REPLAY transitions) acts the same.
    onnx = cartpole.connect(hello(proto, spec, "conformance-compare", "onnx"))
    assert onnx.next("welcome").welcome.policy_version == version
    onnx_version, model = next_policy(onnx)
    assert onnx_version == version
    onnx.cancel()
    player = Player(lambda: gym.make("CartPole-v1"), 4, config["n_step"], config["gamma"])
    rng = np.random.default_rng(0)
    observations = np.stack([t[0] for t in player.play(lambda x: rng.integers(0, 2, len(x)), 64)])
    same_greedy_actions(net, onnx_model(model), {"obs": observations})

    epsilon = apex_epsilon(welcome.settings, config)
    count = MIN_REPLAY // welcome.settings.batch_size + 2

    def batches(seqs, net: QNet, version: int):
        for seq in seqs:
            played = player.play(lambda x: net.act({"obs": x}, epsilon, rng), welcome.settings.batch_size)
            yield with_priorities(proto, welcome, net, version, seq, *player.fields(played))

    assert sorted(send_all(stream, welcome, batches(range(1, count + 1), net, version))) == list(range(1, count + 1))
    poll(lambda: cartpole.status().updates > 0, 120, "the learner to train on the batches")
    newer, payload = next_policy(stream, after=version)
    newer_net = QNet(spec.env_spec, config, state_dict(spec, payload))
    assert send_all(stream, welcome, batches([count + 1], newer_net, newer)) == [count + 1]

    # A batch without the priorities the stream promised: refused on its own stream; nothing stored is lost.
    stored = cartpole.status().buffer_size
    fields, _, _ = player.fields(player.play(lambda x: newer_net.act({"obs": x}, epsilon, rng), 8))
    message = batch_message(proto, welcome, 1, newer, fields)
    ended = refused(cartpole, hello(proto, spec, "conformance-no-priorities"), message)
    assert ended[0] == grpc.StatusCode.INVALID_ARGUMENT, ended
    assert cartpole.status().buffer_size == stored
    stream.cancel()


def test_an_onnx_session_gets_its_model_at_once_and_sends_without_priorities(proto, cartpole):
    spec = cartpole.spec()
    config = json.loads(spec.algorithm_config)
    stream = cartpole.connect(hello(proto, spec, "conformance-onnx", "onnx"))
    first = stream.next()
    assert first.WhichOneof("kind") == "welcome", first
    welcome = first.welcome
    assert welcome.policy_version >= 0 and not welcome.settings.actor_priorities
    update = stream.next()  # the model follows at once, before the actor sends anything
    assert update.WhichOneof("kind") == "policy_update" and update.policy_update.version == welcome.policy_version
    stream.unread(update)
    version, payload = next_policy(stream)
    model = onnx_model(payload)
    assert [i.name for i in model.get_inputs()] == ["obs"] and model.get_outputs()[0].name == "action"
    epsilon, rng = apex_epsilon(welcome.settings, config), np.random.default_rng(1)

    def policy(obs: np.ndarray) -> np.ndarray:
        actions = model.run(["action"], {"obs": obs})[0]
        assert actions.dtype == np.int64 and actions.shape == (len(obs),) and set(actions) <= {0, 1}
        return np.where(rng.random(len(obs)) < epsilon, rng.integers(0, 2, len(obs)), actions)

    player = Player(lambda: gym.make("CartPole-v1"), 4, config["n_step"], config["gamma"])
    messages = [batch_message(proto, welcome, seq, version, player.fields(player.play(policy, 64))[0])
                for seq in (1, 2)]
    assert sorted(send_all(stream, welcome, messages)) == [1, 2]
    stream.cancel()


def leaf_arrays(spec, observations: list) -> dict[str, np.ndarray]:
    """gymnasium observations as the batch/ONNX fields of their leaves ("obs/image", "obs/noise_tuple/0")."""
    def leaf(obs, name: str):
        for key in name.split("/")[1:]:
            obs = obs[key] if isinstance(obs, dict) else obs[int(key)]
        return obs
    return {name: np.stack([leaf(obs, name) for obs in observations]) for name, _ in leaves(spec.env_spec.observation)}


def test_the_documented_network_is_the_learners_on_dict_observations_and_branched_actions(proto):
    """A small image, one-hots (one value out of range), flat leaves, a Tuple, Dict order and two action branches
    with starts: the numpy network of docs/policy-network.md acts as the ONNX model of the same weights."""
    from custom_envs import goal_image

    proc, port = start_learner("--env", "custom_envs:goal_image", "--eval-every", "0", "--dqn-hidden-sizes", "24,16")
    client = Client(proto, port)
    try:
        spec = client.spec()
        stream = client.connect(hello(proto, spec, "conformance-dict"))
        version, payload = next_policy(stream)
        net = QNet(spec.env_spec, json.loads(spec.algorithm_config), state_dict(spec, payload))
        onnx = client.connect(hello(proto, spec, "conformance-dict-onnx", "onnx"))
        onnx_version, model = next_policy(onnx)
        assert onnx_version == version  # nothing trains: no batches
        env, rng = goal_image(), np.random.default_rng(2)
        observations = [env.reset(seed=0)[0]] + [env.step(env.action_space.sample())[0] for _ in range(63)]
        obs = leaf_arrays(spec, observations)
        obs["obs/noise_discrete"][0] = 9  # outside Discrete(5, start=-2): an all-zero one-hot
        obs["obs/position"] = rng.uniform(-1, 2, obs["obs/position"].shape).astype(np.float32)
        same_greedy_actions(net, onnx_model(model), obs)
    finally:
        client.close()
        stop(proc)


def test_a_frame_stacked_session(proto):
    """Frames once per batch, observations as indices into them (the proto's "Frame-stacked batches"); an index
    out of range is INVALID_ARGUMENT. The network: uint8 frames, channels first, a head without dueling."""
    from custom_envs import moving_dot

    stack = 4
    proc, port = start_learner("--env", "custom_envs:moving_dot", "--eval-every", "0", "--frame-stack", str(stack),
                               "--no-dqn-dueling", "--dqn-hidden-sizes", "16", "--dqn-n-step", "2",
                               "--actor-batch-size", "40", "--min-replay-size", "5000")
    client = Client(proto, port)
    try:
        spec = client.spec()
        fields = field_specs(spec.batch_fields)
        observation = spec.env_spec.observation.box
        assert fields["frames"] == (observation.dtype, tuple(observation.shape[1:])) and observation.shape[0] == stack
        assert fields["obs"] == fields["next_obs"] == ("int64", (stack,))
        config = json.loads(spec.algorithm_config)
        stream = client.connect(hello(proto, spec, "conformance-frames"))
        welcome = stream.next("welcome").welcome
        version, payload = next_policy(stream)
        net = QNet(spec.env_spec, config, state_dict(spec, payload))
        onnx = client.connect(hello(proto, spec, "conformance-frames-onnx", "onnx"))
        onnx_version, model = next_policy(onnx)
        assert onnx_version == version
        onnx.cancel()

        player = Player(moving_dot, 3, config["n_step"], config["gamma"], stack=stack)
        rng, epsilon = np.random.default_rng(3), apex_epsilon(welcome.settings, config)

        def play(count: int):
            return player.fields(player.play(lambda x: net.act({"obs": x}, epsilon, rng), count))

        batches = [play(welcome.settings.batch_size) for _ in range(2)]
        same_greedy_actions(net, onnx_model(model), {"obs": np.concatenate([obs for _, obs, _ in batches])})
        assert all(len(fields["frames"]) < 2 * len(fields["action"]) for fields, _, _ in batches)  # not 2 K each
        messages = [with_priorities(proto, welcome, net, version, seq, *batch) for seq, batch in enumerate(batches, 1)]
        assert sorted(send_all(stream, welcome, messages)) == [1, 2]

        stored = client.status().buffer_size
        fields, obs, next_obs = play(8)
        fields["next_obs"][-1, -1] = len(fields["frames"])  # one past the last frame
        message = with_priorities(proto, welcome, net, version, 1, fields, obs, next_obs)
        ended = refused(client, hello(proto, spec, "conformance-frames-bad"), message)
        assert ended[0] == grpc.StatusCode.INVALID_ARGUMENT, ended
        assert client.status().buffer_size == stored
        stream.cancel()
    finally:
        client.close()
        stop(proc)


def test_a_learner_that_stops_sends_shutdown_then_ends_the_stream_with_ok(proto):
    """SIGTERM while the actor only reads: Shutdown, then OK (not UNAVAILABLE or CANCELLED)."""
    proc, port = start_learner(*CARTPOLE)
    client = Client(proto, port)
    try:
        stream = client.connect(hello(proto, client.spec(), "conformance-shutdown"))
        stream.next("welcome")
        next_policy(stream)
        proc.send_signal(signal.SIGTERM)
        stream.next("shutdown")
        code, details = stream.wait_end()
        assert code == grpc.StatusCode.OK, (code, details)
    finally:
        client.close()
        stop(proc)
