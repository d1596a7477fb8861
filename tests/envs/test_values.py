"""values: observations, actions and infos <-> env.proto Value messages, exactly, with clear errors."""

import numpy as np
import pytest

from actorlearner import wire
from actorlearner.v1 import env_pb2
from actorlearner.values import MAX_DEPTH, value_from_proto, value_to_proto
from test_specs import EVERY_SPACE, tensor


@pytest.mark.parametrize("space", EVERY_SPACE, ids=str)
def test_sampled_values_round_trip_exactly(space):
    space.seed(0)
    for _ in range(3):
        value = space.sample()
        back = value_from_proto(env_pb2.Value.FromString(value_to_proto(value).SerializeToString()), space)
        assert space.contains(back)
        assert_same_value(back, value)


def assert_same_value(got, want) -> None:
    if isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            assert_same_value(got[key], want[key])
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_value(g, w)
    else:
        got, want = np.asarray(got), np.asarray(want)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_malformed_values_are_wire_errors():
    with pytest.raises(wire.WireError, match="no kind"):
        value_from_proto(env_pb2.Value())
    with pytest.raises(wire.WireError, match="needs 8 bytes"):
        value_from_proto(env_pb2.Value(tensor=tensor(data=b"abc")))
    with pytest.raises(wire.WireError, match="cap"):
        value_from_proto(env_pb2.Value(tensor=tensor(shape=(1 << 20,), data=b"")), max_bytes=1024)
    repeated = env_pb2.DictValue(entries=[env_pb2.DictValue.Entry(key="k", value=env_pb2.Value(text="x"))] * 2)
    with pytest.raises(wire.WireError, match="repeats key"):
        value_from_proto(env_pb2.Value(dict=repeated))
    deep = env_pb2.Value(text="x")
    for _ in range(MAX_DEPTH + 2):
        deep = env_pb2.Value(tuple=env_pb2.TupleValue(items=[deep]))
    with pytest.raises(wire.WireError, match="deeper"):
        value_from_proto(deep)
    with pytest.raises(ValueError, match="object"):
        value_to_proto(object())
