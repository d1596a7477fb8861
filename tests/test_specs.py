"""specs: gymnasium spaces <-> EnvSpec round trips and human-readable mismatch reasons."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from actorlearner.specs import _DISCRETE_HAS_START, env_spec, spaces_from_spec, spec_mismatch
from actorlearner.v1 import learner_pb2


def assert_box_equal(got: spaces.Box, want: spaces.Box) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.low, want.low)
    np.testing.assert_array_equal(got.high, want.high)


@pytest.mark.parametrize("box", [
    spaces.Box(-np.inf, np.inf, (4,), np.float32),
    spaces.Box(np.array([-1.0, -2.0, 0.0]), np.array([1.0, 2.0, 5.0]), dtype=np.float64),
    spaces.Box(0, 255, (84, 84, 4), np.uint8),
    spaces.Box(-5, 5, (2, 3), np.int16),
    spaces.Box(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (3,), np.int64),
    spaces.Box(-1.0, 1.0, (), np.float16),
])
def test_box_observations_round_trip(box):
    spec = env_spec("Test-v0", box, spaces.Discrete(3))
    obs_space, action_space = spaces_from_spec(spec)
    assert_box_equal(obs_space, box)
    assert action_space == spaces.Discrete(3)
    assert spec_mismatch(spec, env_spec("Other-v0", box, spaces.Discrete(3))) is None


def test_cartpole_spec_through_the_wire():
    env = gym.make("CartPole-v1")
    spec = env_spec("CartPole-v1", env.observation_space, env.action_space)
    decoded = learner_pb2.EnvSpec.FromString(spec.SerializeToString())
    assert decoded == spec
    assert decoded.observation.dtype == "float32" and list(decoded.observation.shape) == [4]
    assert decoded.action.discrete.n == 2
    obs_space, action_space = spaces_from_spec(decoded)
    assert_box_equal(obs_space, env.observation_space)
    assert action_space == env.action_space


def test_uniform_bounds_are_sent_once():
    spec = env_spec("Atari", spaces.Box(0, 255, (84, 84, 4), np.uint8), spaces.Discrete(6))
    assert list(spec.observation.low) == [0.0] and list(spec.observation.high) == [255.0]


def test_empty_bounds_mean_unbounded():
    spec = learner_pb2.EnvSpec(
        observation=learner_pb2.TensorSpec(name="obs", dtype="float32", shape=[2]),
        action=learner_pb2.ActionSpec(discrete=learner_pb2.DiscreteSpec(n=4)))
    obs_space, _ = spaces_from_spec(spec)
    assert_box_equal(obs_space, spaces.Box(-np.inf, np.inf, (2,), np.float32))
    assert spec_mismatch(spec, env_spec("", obs_space, spaces.Discrete(4))) is None


@pytest.mark.parametrize("space, name", [
    (spaces.Box(-1, 1, (2,), np.float32), "Box"),
    (spaces.MultiDiscrete([2, 3]), "MultiDiscrete"),
    (spaces.MultiBinary(3), "MultiBinary"),
])
def test_unsupported_action_spaces_are_named(space, name):
    with pytest.raises(ValueError, match=name):
        env_spec("x", spaces.Box(-1, 1, (2,), np.float32), space)


def test_unsupported_observation_spaces_are_named():
    with pytest.raises(ValueError, match="Discrete"):
        env_spec("x", spaces.Discrete(5), spaces.Discrete(2))
    with pytest.raises(ValueError, match="Dict"):
        env_spec("x", spaces.Dict({"a": spaces.Discrete(2)}), spaces.Discrete(2))


def test_discrete_start():
    action = spaces.Discrete(3, start=-1)
    obs = spaces.Box(-1, 1, (2,), np.float32)
    if _DISCRETE_HAS_START:
        assert spaces_from_spec(env_spec("x", obs, action))[1] == action
    else:  # The proto cannot carry it yet: refuse rather than silently shift actions.
        with pytest.raises(ValueError, match="start=-1"):
            env_spec("x", obs, action)


def test_malformed_specs_are_rejected():
    action = learner_pb2.ActionSpec(discrete=learner_pb2.DiscreteSpec(n=2))
    with pytest.raises(ValueError, match="object"):
        spaces_from_spec(learner_pb2.EnvSpec(
            observation=learner_pb2.TensorSpec(dtype="object", shape=[1]), action=action))
    with pytest.raises(ValueError, match="3 low values"):
        spaces_from_spec(learner_pb2.EnvSpec(
            observation=learner_pb2.TensorSpec(dtype="float32", shape=[2], low=[0, 0, 0]), action=action))
    with pytest.raises(ValueError, match="no observation"):
        spaces_from_spec(learner_pb2.EnvSpec(action=action))
    box_action = learner_pb2.ActionSpec(box=learner_pb2.TensorSpec(dtype="float32", shape=[1]))
    with pytest.raises(ValueError, match="box"):
        spaces_from_spec(learner_pb2.EnvSpec(
            observation=learner_pb2.TensorSpec(dtype="float32", shape=[2]), action=box_action))
    with pytest.raises(ValueError, match="n=0"):
        spaces_from_spec(learner_pb2.EnvSpec(
            observation=learner_pb2.TensorSpec(dtype="float32", shape=[2]),
            action=learner_pb2.ActionSpec(discrete=learner_pb2.DiscreteSpec(n=0))))


def test_mismatch_reasons():
    cartpole = env_spec("CartPole-v1", spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2))
    lunar = env_spec("LunarLander-v3", spaces.Box(-np.inf, np.inf, (8,), np.float32), spaces.Discrete(4))
    assert spec_mismatch(cartpole, lunar) == "observation shape (4,) != (8,); action n 2 != 4"

    as_f64 = env_spec("CartPole-v1", spaces.Box(-np.inf, np.inf, (4,), np.float64), spaces.Discrete(2))
    assert spec_mismatch(cartpole, as_f64) == "observation dtype float32 != float64"

    bounded = env_spec("CartPole-v1", spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    reason = spec_mismatch(cartpole, bounded)
    assert reason == "observation low bounds differ: [-inf] != [-1]; observation high bounds differ: [inf] != [1]"

    no_action = learner_pb2.EnvSpec(observation=cartpole.observation)
    assert spec_mismatch(cartpole, no_action) == "action kind discrete != None"
    assert spec_mismatch(cartpole, cartpole) is None
