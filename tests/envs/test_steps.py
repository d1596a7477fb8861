"""StepFormat: raw step bytes are exactly env.proto's encoding, and anything else falls back."""

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from actorlearner.envs.steps import StepFormat
from actorlearner.v1 import env_pb2 as pb
from actorlearner.values import value_from_proto, value_to_proto

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
FORMATS = [
    (OBS, spaces.Discrete(2)),
    (spaces.Box(0, 255, (3, 5), np.uint8), spaces.Discrete(6, start=-2)),
    (spaces.Box(-1, 1, (3,), np.float64), spaces.Box(-2, 2, (2,), np.float32)),
]


@pytest.mark.parametrize("obs_space, action_space", FORMATS, ids=str)
def test_fast_bytes_are_the_protobuf_encoding(obs_space, action_space):
    steps = StepFormat(obs_space, action_space)
    action_space.seed(0)
    obs_space.seed(0)
    for _ in range(20):
        action = action_space.sample()
        request = pb.EnvRequest.FromString(steps.encode_request(action))
        np.testing.assert_array_equal(value_from_proto(request.step.action, action_space), action)
        decoded = steps.decode_request(request.SerializeToString())
        np.testing.assert_array_equal(decoded, action)

        obs, reward = obs_space.sample(), float(np.random.default_rng(0).normal())
        raw = steps.encode_response(obs, reward, True, False)
        step = pb.EnvResponse.FromString(raw).step
        np.testing.assert_array_equal(value_from_proto(step.observation, obs_space), obs)
        assert (step.reward, step.terminated, step.truncated) == (reward, True, False)
        got_obs, got_reward, terminated, truncated = steps.decode_response(raw)
        np.testing.assert_array_equal(got_obs, obs)
        assert got_obs.flags.writeable and (got_reward, terminated, truncated) == (reward, True, False)


def test_other_encodings_and_values_take_the_protobuf_path():
    steps = StepFormat(OBS, spaces.Discrete(3))
    assert steps.encode_request(np.int32(1)) == steps.encode_request(1) == steps.encode_request(np.int64(1))
    assert steps.encode_request(True) is None
    outside = pb.EnvRequest(step=pb.StepRequest(action=value_to_proto(np.int64(3)))).SerializeToString()
    assert steps.encode_request(3) == outside
    assert steps.decode_request(outside) is None  # the protobuf path refuses it with a clear error
    boxed = StepFormat(OBS, spaces.Box(-1, 1, (2,), np.float32))
    assert boxed.encode_request(np.zeros(2, np.float64)) is None  # not the space's dtype
    assert boxed.encode_request(np.zeros(3, np.float32)) is None
    inside = boxed.encode_request(np.full(2, 0.5, np.float32))
    np.testing.assert_array_equal(boxed.decode_request(inside), [0.5, 0.5])
    assert boxed.decode_request(boxed.encode_request(np.full(2, 5.0, np.float32))) is None  # out of bounds
    # A server that leaves default fields out (reward 0, flags false) is parsed the ordinary way.
    obs = np.zeros(4, np.float32)
    minimal = pb.EnvResponse(step=pb.StepResponse(observation=value_to_proto(obs))).SerializeToString()
    assert steps.decode_response(minimal) is None
    assert steps.encode_response(obs.astype(np.float64), 0.0, False, False) is None
    with_info = pb.EnvResponse(step=pb.StepResponse(observation=value_to_proto(obs), reward=1.0, terminated=True,
                                                    truncated=True, info=pb.DictValue(entries=[
                                                        pb.DictValue.Entry(key="k", value=pb.Value(text="v"))])))
    assert steps.decode_response(with_info.SerializeToString()) is None


def test_spaces_without_a_fixed_layout_have_no_fast_path():
    steps = StepFormat(spaces.Dict({"a": OBS}), spaces.MultiDiscrete([2, 2]))
    assert steps.encode_request(np.array([0, 1])) is None
    assert steps.encode_response({"a": np.zeros(4, np.float32)}, 0.0, False, False) is None
    assert steps.decode_request(b"anything") is None and steps.decode_response(b"anything") is None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_are_recognized_or_passed_on(raw):
    steps = StepFormat(OBS, spaces.Discrete(2))
    action = steps.decode_request(raw)
    assert action is None or action in (0, 1)
    step = steps.decode_response(raw)
    if step is not None:  # then it must be exactly what protobuf reads from the same bytes
        parsed = pb.EnvResponse.FromString(raw).step
        assert (step[1], step[2], step[3]) == (parsed.reward, parsed.terminated, parsed.truncated)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=16, max_size=16), st.floats(allow_nan=False), st.booleans(), st.booleans())
def test_bit_flips_in_a_fast_response_never_pass_as_something_else(data, reward, terminated, truncated):
    steps = StepFormat(OBS, spaces.Discrete(2))
    raw = bytearray(steps.encode_response(np.frombuffer(data, np.float32).copy(), reward, terminated, truncated))
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0x40
        step = steps.decode_response(bytes(flipped))
        if step is not None:
            parsed = pb.EnvResponse.FromString(bytes(flipped)).step
            np.testing.assert_array_equal(step[0], value_from_proto(parsed.observation, OBS))
            assert (step[1], step[2], step[3]) == (parsed.reward, parsed.terminated, parsed.truncated) or np.isnan(step[1])
