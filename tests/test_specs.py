"""specs: gymnasium spaces <-> EnvSpec and env.proto messages, exact round trips, clear errors."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from actorlearner import wire
from actorlearner.specs import env_spec, space_from_proto, space_to_proto, spaces_from_spec, spec_mismatch
from actorlearner.v1 import env_pb2, learner_pb2
from actorlearner.values import MAX_DEPTH


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
    assert spaces_from_spec(env_spec("x", obs, action))[1] == action


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


@pytest.mark.parametrize("shape", [[2**32 + 1], [2**20, 2**20], [1] * 17], ids=["4G elements", "1T elements", "rank 17"])
def test_huge_shapes_are_refused_before_allocating(shape):
    """Found by fuzzing: bounds for a 2**32-element Box were allocated (32 GiB) before any check."""
    with pytest.raises(ValueError, match="too large"):
        spaces_from_spec(learner_pb2.EnvSpec(observation=learner_pb2.TensorSpec(dtype="bool", shape=shape),
                                             action=learner_pb2.ActionSpec(discrete=learner_pb2.DiscreteSpec(n=1))))


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


# --------------------------------------------------------------------------- env.proto spaces and values

def assert_same_space(got: spaces.Space, want: spaces.Space) -> None:
    """Exact equality: type, dtype, shape, every bound and key order (gymnasium's == is approximate)."""
    assert type(got) is type(want), (got, want)
    assert got == want
    if isinstance(want, spaces.Dict):
        assert list(got.keys()) == list(want.keys())
        for key in want.keys():
            assert_same_space(got[key], want[key])
    elif isinstance(want, spaces.Tuple):
        for g, w in zip(got, want, strict=True):
            assert_same_space(g, w)
    else:
        assert got.dtype == want.dtype and got.shape == want.shape
    if isinstance(want, spaces.Box):
        np.testing.assert_array_equal(got.low, want.low)
        np.testing.assert_array_equal(got.high, want.high)
    if isinstance(want, spaces.MultiDiscrete):
        np.testing.assert_array_equal(got.nvec, want.nvec)
        np.testing.assert_array_equal(got.start, want.start)
    if isinstance(want, spaces.MultiBinary):
        assert type(got.n) is type(want.n)


EVERY_SPACE = [
    *[spaces.Box(0, 1, (2, 3), dtype) for dtype in ("bool", "uint8", "int8", "uint16", "int16", "uint32",
                                                    "int32", "uint64", "int64", "float16", "float32", "float64")],
    spaces.Box(np.array([-1.0, -np.inf, 0.5]), np.array([1.0, np.inf, 0.75]), dtype=np.float64),
    spaces.Box(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (3,), np.int64),
    spaces.Box(0, 255, (84, 84, 4), np.uint8),
    spaces.Box(-2.0, 2.0, (), np.float32),
    spaces.Discrete(5),
    spaces.Discrete(3, start=-1),
    spaces.Discrete(7, start=10, dtype=np.int32),
    spaces.MultiDiscrete([3, 4, 5]),
    spaces.MultiDiscrete([[2, 3], [4, 5]], dtype=np.int8, start=[[0, -1], [2, 0]]),
    spaces.MultiBinary(5),
    spaces.MultiBinary([5]),
    spaces.MultiBinary([2, 3]),
    spaces.Dict([("z", spaces.Discrete(2)), ("a", spaces.Box(-1, 1, (2,), np.float32))]),
    spaces.Tuple([spaces.Discrete(2), spaces.MultiBinary(3)]),
    spaces.Tuple([spaces.Dict({"inner": spaces.Tuple([spaces.Box(0, 1, (1,), np.float32),
                                                      spaces.Dict({"deep": spaces.MultiDiscrete([2, 2])})])}),
                  spaces.Discrete(4, start=1)]),
]


@pytest.mark.parametrize("space", EVERY_SPACE, ids=str)
def test_every_supported_space_round_trips_exactly(space):
    message = env_pb2.Space.FromString(space_to_proto(space).SerializeToString())
    assert_same_space(space_from_proto(message), space)


def leaf_spaces():
    dtypes = st.sampled_from(["uint8", "int16", "int32", "uint64", "int64", "float16", "float32", "float64"])
    shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)
    return st.one_of(
        st.builds(lambda d, s: spaces.Box(0, 3, s, d), dtypes, shapes),
        st.builds(lambda n, start: spaces.Discrete(n, start=start), st.integers(1, 9), st.integers(-5, 5)),
        st.builds(lambda nvec: spaces.MultiDiscrete(nvec), st.lists(st.integers(1, 6), min_size=1, max_size=4)),
        st.builds(spaces.MultiBinary, st.one_of(st.integers(1, 5), st.lists(st.integers(1, 3), min_size=1, max_size=3))),
    )


nested_spaces = st.recursive(leaf_spaces(), lambda children: st.one_of(
    st.lists(children, min_size=1, max_size=3).map(spaces.Tuple),
    st.lists(st.tuples(st.text(min_size=1, max_size=5), children), min_size=1, max_size=3,
             unique_by=lambda kv: kv[0]).map(spaces.Dict),
), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(nested_spaces)
def test_random_nested_spaces_round_trip(space):
    assert_same_space(space_from_proto(space_to_proto(space)), space)


@pytest.mark.parametrize("space, name", [
    (spaces.Text(5), "Text"),
    (spaces.Graph(spaces.Box(0, 1, (2,)), None), "Graph"),
    (spaces.Sequence(spaces.Discrete(2)), "Sequence"),
    (spaces.OneOf([spaces.Discrete(2), spaces.Discrete(3)]), "OneOf"),
    (spaces.Dict({"ok": spaces.Discrete(2), "bad": spaces.Text(3)}), "Text"),
])
def test_unsupported_spaces_are_named(space, name):
    with pytest.raises(ValueError, match=name):
        space_to_proto(space)


def tensor(dtype="float32", shape=(2,), data=None):
    itemsize = np.dtype(dtype).itemsize
    return env_pb2.Tensor(dtype=dtype, shape=shape, data=b"\0" * (itemsize * int(np.prod(shape))) if data is None else data)


def nested_tuple(depth: int) -> env_pb2.Space:
    space = env_pb2.Space(discrete=env_pb2.DiscreteSpace(n=2))
    for _ in range(depth):
        space = env_pb2.Space(tuple=env_pb2.TupleSpace(spaces=[space]))
    return space


@pytest.mark.parametrize("message, match", [
    (env_pb2.Space(), "no kind"),
    (env_pb2.Space(box=env_pb2.BoxSpace(dtype="float32", shape=[2], low=tensor("float64"), high=tensor())), "bounds"),
    (env_pb2.Space(box=env_pb2.BoxSpace(dtype="float32", shape=[3], low=tensor(), high=tensor())), "bounds"),
    (env_pb2.Space(box=env_pb2.BoxSpace(dtype="float32", shape=[2], low=tensor(data=b"x"), high=tensor())), "bytes"),
    (env_pb2.Space(box=env_pb2.BoxSpace(dtype="object", shape=[2], low=tensor("object"), high=tensor())), "dtype"),
    (env_pb2.Space(discrete=env_pb2.DiscreteSpace(n=0)), "n >= 1"),
    (env_pb2.Space(discrete=env_pb2.DiscreteSpace(n=2, dtype="float32")), "integer"),
    (env_pb2.Space(multi_discrete=env_pb2.MultiDiscreteSpace(nvec=tensor("int64"), start=tensor("int32"))), "start"),
    (env_pb2.Space(multi_discrete=env_pb2.MultiDiscreteSpace(nvec=tensor("float32"), start=tensor())), "integer"),
    (env_pb2.Space(multi_binary=env_pb2.MultiBinarySpace(shape=[2, 2], n_is_scalar=True)), "rank-1"),
    (env_pb2.Space(dict=env_pb2.DictSpace(entries=[env_pb2.DictSpace.Entry(key="a", space=nested_tuple(0))] * 2)),
     "repeated"),
    (nested_tuple(MAX_DEPTH + 2), "deeper"),
])
def test_malformed_space_messages_are_wire_errors(message, match):
    with pytest.raises(wire.WireError, match=match):
        space_from_proto(message)
