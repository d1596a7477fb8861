"""specs: gymnasium spaces <-> EnvSpec and env.proto messages, exact round trips, clear errors."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from actorlearner import wire
from actorlearner.specs import (
    env_spec,
    space_from_proto,
    space_to_proto,
    spaces_from_spec,
    spec_mismatch,
)
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
    assert decoded == spec and decoded.env_id == "CartPole-v1"
    assert decoded.observation.box.dtype == "float32" and list(decoded.observation.box.shape) == [4]
    assert decoded.action.discrete.n == 2
    obs_space, action_space = spaces_from_spec(decoded)
    assert_box_equal(obs_space, env.observation_space)
    assert action_space == env.action_space


def test_bounds_are_whole_tensors_of_the_box_dtype():
    """env.proto sends each bound as a tensor of the Box's own dtype and shape (uint8 frames: 1 byte each)."""
    spec = env_spec("Atari", spaces.Box(0, 255, (84, 84, 4), np.uint8), spaces.Discrete(6))
    for bound, value in ((spec.observation.box.low, 0), (spec.observation.box.high, 255)):
        assert bound.dtype == "uint8" and list(bound.shape) == [84, 84, 4]
        assert len(bound.data) == 84 * 84 * 4 and set(bound.data) == {value}


def test_a_box_without_bounds_is_malformed():
    """Protocol 1 read empty bounds as unbounded; env.proto's BoxSpace always carries both tensors."""
    spec = learner_pb2.EnvSpec(observation=env_pb2.Space(box=env_pb2.BoxSpace(dtype="float32", shape=[2])),
                               action=space_to_proto(spaces.Discrete(4)))
    with pytest.raises(wire.WireError, match="dtype"):
        spaces_from_spec(spec)
    expected = env_spec("", spaces.Box(-np.inf, np.inf, (2,), np.float32), spaces.Discrete(4))
    assert spec_mismatch(expected, spec).startswith("observation space malformed: ")


@pytest.mark.parametrize("action", [
    spaces.Discrete(3, start=-1),
    spaces.Box(-1, 1, (2,), np.float32),
    spaces.MultiDiscrete([2, 3]),
    spaces.MultiDiscrete([3, 2], start=[-1, 0]),
    spaces.MultiBinary(3),
], ids=str)
def test_every_discrete_or_box_action_space_round_trips(action):
    """The spec describes any space env.proto can; whether an algorithm can learn it is its own check."""
    obs = spaces.Box(-1, 1, (2,), np.float32)
    spec = learner_pb2.EnvSpec.FromString(env_spec("x", obs, action).SerializeToString())
    assert_same_space(spaces_from_spec(spec)[1], action)
    assert spec_mismatch(spec, env_spec("y", obs, action)) is None


COMPOSITE_OBSERVATIONS = {
    "discrete": spaces.Discrete(5),
    "dict": spaces.Dict([("camera", spaces.Box(0, 255, (8, 8, 3), np.uint8)), ("position", spaces.Discrete(4, start=1)),
                         ("flags", spaces.MultiBinary(2))]),
    "tuple": spaces.Tuple([spaces.MultiDiscrete([3, 2], start=[-1, 0]), spaces.Box(-1, 1, (2,), np.float64)]),
    "nested": spaces.Dict({"sensors": spaces.Tuple([spaces.Discrete(2), spaces.Dict({"imu": spaces.Box(-1, 1, (6,))})]),
                           "goal": spaces.MultiDiscrete([[2, 3], [4, 5]])}),
}


@pytest.mark.parametrize("obs", COMPOSITE_OBSERVATIONS.values(), ids=COMPOSITE_OBSERVATIONS.keys())
def test_dict_tuple_and_discrete_observations_round_trip(obs):
    action = spaces.MultiDiscrete([3, 2], start=[-1, 0])
    spec = learner_pb2.EnvSpec.FromString(env_spec("x", obs, action).SerializeToString())
    got_obs, got_action = spaces_from_spec(spec)
    assert_same_space(got_obs, obs)
    assert_same_space(got_action, action)
    assert spec_mismatch(spec, env_spec("y", obs, action)) is None


@pytest.mark.parametrize("role", ["observation", "action"])
def test_spaces_env_proto_cannot_describe_are_named(role):
    box = spaces.Box(-1, 1, (2,), np.float32)
    text = spaces.Text(4)
    with pytest.raises(ValueError, match="Text"):
        env_spec("x", text, box) if role == "observation" else env_spec("x", box, text)


def test_malformed_specs_are_rejected():
    discrete = space_to_proto(spaces.Discrete(2))
    box = space_to_proto(spaces.Box(-1, 1, (2,), np.float32))
    with pytest.raises(wire.WireError, match="object"):
        spaces_from_spec(learner_pb2.EnvSpec(
            observation=env_pb2.Space(box=env_pb2.BoxSpace(dtype="object", shape=[1], low=tensor("object", (1,), b""),
                                                           high=tensor("object", (1,), b""))), action=discrete))
    short_low = env_pb2.Space()
    short_low.CopyFrom(box)
    short_low.box.shape[:] = [3]
    with pytest.raises(wire.WireError, match="bounds"):
        spaces_from_spec(learner_pb2.EnvSpec(observation=short_low, action=discrete))
    with pytest.raises(wire.WireError, match="no observation"):
        spaces_from_spec(learner_pb2.EnvSpec(action=discrete))
    with pytest.raises(wire.WireError, match="no action"):
        spaces_from_spec(learner_pb2.EnvSpec(observation=box))
    with pytest.raises(wire.WireError, match="no kind"):
        spaces_from_spec(learner_pb2.EnvSpec(observation=box, action=env_pb2.Space()))
    with pytest.raises(wire.WireError, match="n >= 1"):
        spaces_from_spec(learner_pb2.EnvSpec(observation=box,
                                             action=env_pb2.Space(discrete=env_pb2.DiscreteSpace(n=0))))


@pytest.mark.parametrize("shape", [[2**32 + 1], [2**20, 2**20], [1] * 17], ids=["4G elements", "1T elements", "rank 17"])
def test_huge_shapes_are_refused_before_allocating(shape):
    """Found by fuzzing (protocol 1): bounds for a 2**32-element Box were allocated (32 GiB) before any check.
    Now the bounds are tensors, checked against the byte cap before anything is allocated."""
    bound = env_pb2.Tensor(dtype="bool", shape=shape, data=b"")
    huge = env_pb2.Space(box=env_pb2.BoxSpace(dtype="bool", shape=shape, low=bound, high=bound))
    with pytest.raises(wire.WireError, match="cap"):
        spaces_from_spec(learner_pb2.EnvSpec(observation=huge, action=space_to_proto(spaces.Discrete(1))))


CARTPOLE = env_spec("CartPole-v1", spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2))


def mismatch(obs: spaces.Space, action: spaces.Space, want_obs: spaces.Space | None = None,
             want_action: spaces.Space | None = None) -> str | None:
    """spec_mismatch(expected, got) with ``got`` = (obs, action) sent through the wire."""
    expected = env_spec("want", want_obs or obs, want_action or action)
    got = learner_pb2.EnvSpec.FromString(env_spec("got", obs, action).SerializeToString())
    return spec_mismatch(expected, got)


def test_mismatch_reasons():
    lunar = env_spec("LunarLander-v3", spaces.Box(-np.inf, np.inf, (8,), np.float32), spaces.Discrete(4))
    assert spec_mismatch(CARTPOLE, lunar) == ("observation shape (4,) != (8,); "
                                              "action Discrete(n=2, start=0) != Discrete(n=4, start=0)")

    as_f64 = env_spec("CartPole-v1", spaces.Box(-np.inf, np.inf, (4,), np.float64), spaces.Discrete(2))
    assert spec_mismatch(CARTPOLE, as_f64).startswith("observation dtype float32 != float64")

    bounded = env_spec("CartPole-v1", spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    assert spec_mismatch(CARTPOLE, bounded) == (
        "observation bounds [-inf, -inf, -inf, -inf]..[inf, inf, inf, inf] != bounds [-1, -1, -1, -1]..[1, 1, 1, 1]")

    assert spec_mismatch(CARTPOLE, learner_pb2.EnvSpec(observation=CARTPOLE.observation)) == "action space missing"
    assert spec_mismatch(CARTPOLE, learner_pb2.EnvSpec()) == "observation space missing; action space missing"
    assert spec_mismatch(CARTPOLE, CARTPOLE) is None
    assert spec_mismatch(CARTPOLE, env_spec("another id", *spaces_from_spec(CARTPOLE))) is None  # env_id not compared


def test_long_bounds_are_cut_in_the_reason():
    reason = mismatch(spaces.Box(0, 2, (6,), np.float32), spaces.Discrete(2), want_obs=spaces.Box(0, 1, (6,), np.float32))
    assert reason == "observation bounds [0, 0, 0, 0, ...]..[1, 1, 1, 1, ...] != bounds [0, 0, 0, 0, ...]..[2, 2, 2, 2, ...]"


def test_mismatch_names_the_leaf_path_and_what_differs():
    camera = spaces.Dict({"camera": spaces.Box(0, 255, (84, 84, 3), np.uint8), "speed": spaces.Discrete(3)})
    small = spaces.Dict({"camera": spaces.Box(0, 255, (64, 64, 3), np.uint8), "speed": spaces.Discrete(3)})
    d2 = spaces.Discrete(2)
    assert mismatch(small, d2, want_obs=camera) == "observation/camera shape (84, 84, 3) != (64, 64, 3)"

    float_camera = spaces.Dict({"camera": spaces.Box(0, 255, (84, 84, 3), np.float32), "speed": spaces.Discrete(3)})
    assert mismatch(float_camera, d2, want_obs=camera).startswith("observation/camera dtype uint8 != float32")

    started = spaces.Dict({"camera": spaces.Box(0, 255, (84, 84, 3), np.uint8), "speed": spaces.Discrete(3, start=1)})
    assert mismatch(started, d2, want_obs=camera) == "observation/speed Discrete(n=3, start=0) != Discrete(n=3, start=1)"

    renamed = spaces.Dict({"camera": spaces.Box(0, 255, (84, 84, 3), np.uint8), "velocity": spaces.Discrete(3)})
    assert mismatch(renamed, d2, want_obs=camera) == "observation keys ['camera', 'speed'] != ['camera', 'velocity']"

    nested = spaces.Tuple([spaces.Discrete(2), spaces.Dict({"imu": spaces.Box(-1, 1, (6,), np.float32)})])
    wider = spaces.Tuple([spaces.Discrete(2), spaces.Dict({"imu": spaces.Box(-2, 1, (6,), np.float32)})])
    assert mismatch(wider, d2, want_obs=nested).startswith("observation/1/imu bounds [-1, -1, -1, -1, ...]")
    longer = spaces.Tuple([*nested, spaces.Discrete(2)])
    assert mismatch(longer, d2, want_obs=nested) == "observation has 2 items != 3"

    md = spaces.MultiDiscrete([3, 2], start=[-1, 0])
    assert mismatch(spaces.MultiDiscrete([3, 3], start=[-1, 0]), d2, want_obs=md) == (
        "observation MultiDiscrete(nvec=[3, 2], start=[-1, 0]) != MultiDiscrete(nvec=[3, 3], start=[-1, 0])")
    assert mismatch(spaces.MultiDiscrete([3, 2]), d2, want_obs=md) == (
        "observation MultiDiscrete(nvec=[3, 2], start=[-1, 0]) != MultiDiscrete(nvec=[3, 2], start=[0, 0])")
    assert mismatch(spaces.MultiBinary(3), d2, want_obs=spaces.MultiBinary(4)) == "observation shape (4,) != (3,)"

    box = spaces.Box(-1, 1, (2,), np.float32)
    assert mismatch(box, md, want_action=d2) == "action Discrete != MultiDiscrete"
    assert mismatch(spaces.Tuple([box]), d2, want_obs=spaces.Dict({"0": box})) == "observation Dict != Tuple"

    both = mismatch(small, md, want_obs=camera, want_action=d2)
    assert both == "observation/camera shape (84, 84, 3) != (64, 64, 3); action Discrete != MultiDiscrete"


def test_a_malformed_space_in_got_is_a_reason_not_an_exception():
    no_kind = learner_pb2.EnvSpec(observation=env_pb2.Space(), action=CARTPOLE.action)
    assert spec_mismatch(CARTPOLE, no_kind) == "observation space malformed: space message has no kind set"
    bad_discrete = learner_pb2.EnvSpec(observation=CARTPOLE.observation,
                                       action=env_pb2.Space(discrete=env_pb2.DiscreteSpace(n=0)))
    assert spec_mismatch(CARTPOLE, bad_discrete).startswith("action space malformed: ")
    repeated = env_pb2.Space(dict=env_pb2.DictSpace(entries=[
        env_pb2.DictSpace.Entry(key="a", space=CARTPOLE.action)] * 2))
    reason = spec_mismatch(CARTPOLE, learner_pb2.EnvSpec(observation=repeated, action=env_pb2.Space()))
    assert reason.startswith("observation space malformed: ") and "repeated" in reason
    assert "; action space malformed: space message has no kind set" in reason


def test_a_dtype_mismatch_is_one_reason():
    as_f64 = env_spec("CartPole-v1", spaces.Box(-np.inf, np.inf, (4,), np.float64), spaces.Discrete(2))
    assert spec_mismatch(CARTPOLE, as_f64) == "observation dtype float32 != float64"
    assert mismatch(spaces.Discrete(2, dtype=np.int32), spaces.Discrete(2), want_obs=spaces.Discrete(2)) == (
        "observation dtype int64 != int32")


@pytest.mark.parametrize("want, got", [
    (spaces.Box(0, 1, (3,), np.float32), spaces.Box(0, 1.000005, (3,), np.float32)),
    (spaces.Box(0, 2**40, (3,), np.int64), spaces.Box(0, 2**40 + 5000, (3,), np.int64)),
], ids=["float32", "int64"])
def test_bounds_are_compared_exactly(want, got):
    assert mismatch(got, spaces.Discrete(2), want_obs=want) is not None


# --------------------------------------------------------------------------- env.proto spaces and values

def assert_same_space(got: spaces.Space, want: spaces.Space) -> None:
    """Exact equality: type, dtype, shape, every bound and key order (gymnasium's == is approximate)."""
    assert type(got) is type(want), (got, want)
    assert got == want
    if isinstance(want, spaces.Dict):
        assert list(got.keys()) == list(want.keys())
        for key in want:
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
