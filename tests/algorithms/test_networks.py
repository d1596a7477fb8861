"""actorlearner.networks: leaves of gymnasium spaces, observation encoders, branching Q heads."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from custom_envs import DictWalkEnv
from gymnasium import spaces

from actorlearner.networks import (
    BranchingDuelingHead,
    ObservationEncoder,
    UnsupportedSpace,
    action_branches,
    field_name,
    leaf_arrays,
    leaf_fields,
    leaf_spaces,
)

NESTED = spaces.Dict([
    ("camera", spaces.Box(0, 255, (12, 12, 3), np.uint8)),
    ("sensors", spaces.Dict([("imu", spaces.Box(-1, 1, (6,), np.float32)), ("on", spaces.MultiBinary(2))])),
    ("pair", spaces.Tuple((spaces.Discrete(4, start=1), spaces.MultiDiscrete([3, 2])))),
])


class TupleEnv(gym.Env):
    """Tuple observations holding a Dict: a uint8 image and a Discrete counter."""

    def __init__(self):
        self.observation_space = spaces.Tuple((
            spaces.Dict([("image", spaces.Box(0, 255, (5, 5), np.uint8)), ("count", spaces.Discrete(10))]),
            spaces.Box(-1, 1, (), np.float64),
        ))
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        return self._obs(), 0.0, False, self.count >= 9, {}

    def _obs(self):
        image = self.np_random.integers(0, 256, (5, 5), dtype=np.uint8)
        return {"image": image, "count": self.count}, np.float64(self.np_random.uniform(-1, 1))


def stack(items: list):
    """Per-item values stacked leaf-wise, as a gymnasium vector env batches them."""
    if isinstance(items[0], dict):
        return {key: stack([item[key] for item in items]) for key in items[0]}
    if isinstance(items[0], tuple):
        return tuple(stack([item[i] for item in items]) for i in range(len(items[0])))
    return np.stack(items)


def batch_of(space: gym.Space, batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``batch`` seeded samples of ``space`` as the encoder takes them: ``{key: Tensor[B, ...]}``."""
    space.seed(seed)
    arrays = leaf_arrays(space, stack([space.sample() for _ in range(batch)]))
    return {key: torch.as_tensor(array) for key, array in arrays.items()}


# --- leaves ---------------------------------------------------------------------------------

def test_a_plain_space_is_one_leaf_with_the_empty_key():
    box = spaces.Box(0, 1, (3,), np.float32)
    assert leaf_spaces(box) == {"": box}
    assert leaf_fields(spaces.Discrete(5)) == {"": ((), np.dtype(np.int64))}
    assert field_name("obs", "") == "obs"
    assert field_name("next_obs", "camera") == "next_obs/camera"


def test_nested_dict_and_tuple_leaves_keep_the_spaces_order():
    assert list(leaf_spaces(NESTED)) == ["camera", "sensors/imu", "sensors/on", "pair/0", "pair/1"]
    assert leaf_spaces(NESTED)["pair/0"] is NESTED["pair"][0]
    assert list(leaf_spaces(spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))))) == ["0", "1"]
    assert list(leaf_spaces(spaces.Dict([("z", spaces.Discrete(2)), ("a", spaces.Discrete(2))]))) == ["z", "a"]


def test_leaf_fields_are_the_stored_shapes_and_dtypes():
    assert leaf_fields(NESTED) == {
        "camera": ((12, 12, 3), np.dtype(np.uint8)),
        "sensors/imu": ((6,), np.dtype(np.float32)),
        "sensors/on": ((2,), np.dtype(np.int8)),
        "pair/0": ((), np.dtype(np.int64)),
        "pair/1": ((2,), np.dtype(np.int64)),
    }
    assert leaf_fields(spaces.Box(0, 1, (2, 2), bool)) == {"": ((2, 2), np.dtype(bool))}
    assert leaf_fields(spaces.Box(-1, 1, (), np.float16)) == {"": ((), np.dtype(np.float16))}


@pytest.mark.parametrize("make_env", [DictWalkEnv, TupleEnv])
def test_leaf_arrays_split_real_vector_env_batches(make_env):
    envs = gym.vector.SyncVectorEnv([make_env for _ in range(3)])
    batch, _ = envs.reset(seed=7)
    arrays = leaf_arrays(envs.single_observation_space, batch)
    fields = leaf_fields(envs.single_observation_space)
    assert list(arrays) == list(fields)
    for key, (shape, dtype) in fields.items():
        assert arrays[key].shape == (3, *shape) and arrays[key].dtype == dtype
    for index in range(3):  # sub-env i was reset with seed 7 + i
        own, _ = make_env().reset(seed=7 + index)
        own_arrays = leaf_arrays(envs.single_observation_space, stack([own]))
        for key in fields:
            np.testing.assert_array_equal(arrays[key][index], own_arrays[key][0])


def test_leaf_arrays_keep_stored_arrays_and_cast_only_when_needed():
    image = np.full((2, 12, 12, 3), 255, np.uint8)
    batch = {"camera": image, "sensors": {"imu": np.zeros((2, 6)), "on": np.ones((2, 2), np.int8)},
             "pair": (np.array([1, 4]), np.array([[0, 1], [2, 0]]))}
    arrays = leaf_arrays(NESTED, batch)
    assert arrays["camera"] is image
    assert arrays["sensors/imu"].dtype == np.float32
    with pytest.raises(ValueError, match="sensors/imu"):
        leaf_arrays(NESTED, {**batch, "sensors": {"imu": np.zeros((2, 5)), "on": batch["sensors"]["on"]}})


def nested(depth: int) -> spaces.Space:
    space = spaces.Discrete(2)
    for _ in range(depth):
        space = spaces.Dict({"d": space})
    return space


UNSUPPORTED_OBSERVATIONS = [
    (spaces.Text(10, min_length=1), "Text(1, 10"),
    (spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(3)), "Graph("),
    (spaces.Sequence(spaces.Discrete(2)), "Sequence(Discrete(2)"),
    (spaces.OneOf([spaces.Discrete(2), spaces.Discrete(3)]), "OneOf("),
    (spaces.Dict(), "Dict()"),
    (spaces.Tuple(()), "Tuple()"),
    (spaces.Box(0, 1, (0, 3)), "Box([], [], (0, 3)"),
    (spaces.MultiDiscrete(np.zeros(0, np.int64)), "MultiDiscrete([])"),
    pytest.param(spaces.Box(0, 1, (2,), np.longdouble), "float128", marks=pytest.mark.skipif(
        np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here")),
    (spaces.Dict({"ok": spaces.Discrete(2), "notes": spaces.Dict({"t": spaces.Text(5)})}), '"notes/t"'),
    (spaces.Dict({"a/b": spaces.Discrete(2)}), "'a/b'"),
    (nested(9), "nested deeper than 8"),
]


@pytest.mark.parametrize(("space", "named"), UNSUPPORTED_OBSERVATIONS, ids=lambda v: type(v).__name__)
def test_unsupported_observation_spaces_raise_a_one_line_message_naming_them(space, named):
    with pytest.raises(UnsupportedSpace, match=r"^observation space ") as caught:
        leaf_spaces(space)
    message = str(caught.value)
    assert named in message and "\n" not in message and "is not supported" in message
    with pytest.raises(UnsupportedSpace):
        ObservationEncoder(space, (8,))


def test_nesting_up_to_eight_is_supported():
    assert list(leaf_spaces(nested(8))) == ["/".join(["d"] * 8)]


# --- encoders -------------------------------------------------------------------------------

def conv_shapes(encoder: ObservationEncoder) -> list[tuple[int, int, int, int]]:
    return [(conv.in_channels, conv.out_channels, conv.kernel_size[0], conv.stride[0])
            for conv in encoder.modules() if isinstance(conv, torch.nn.Conv2d)]


def test_nature_torso_for_84x84x4_and_small_torso_for_10x10x4():
    nature = ObservationEncoder(spaces.Box(0, 255, (84, 84, 4), np.uint8), ())
    assert conv_shapes(nature) == [(4, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1)]
    assert nature.output_dim == 64 * 7 * 7
    small = ObservationEncoder(spaces.Box(0, 1, (10, 10, 4), bool), (32,))
    assert conv_shapes(small) == [(4, 16, 3, 1)]
    assert small.mlp[0].in_features == 16 * 8 * 8 and small.output_dim == 32


@pytest.mark.parametrize(("shape", "dtype", "channel_order", "channels"), [
    ((84, 84, 4), np.uint8, "auto", 4),   # HWC
    ((4, 84, 84), np.uint8, "auto", 4),   # CHW
    ((8, 10, 8), np.float32, "auto", 8),  # tie -> last
    ((6, 10, 8), np.float32, "auto", 6),
    ((6, 10, 8), np.float32, "hwc", 8),
    ((8, 10, 6), np.float32, "chw", 8),
    ((16, 20), np.uint8, "auto", 1),      # HW, one channel
])
def test_channel_axis_detection_and_forcing(shape, dtype, channel_order, channels):
    encoder = ObservationEncoder(spaces.Box(0, 1, shape, dtype), (), channel_order)
    assert conv_shapes(encoder)[0][0] == channels


@pytest.mark.parametrize("space", [
    spaces.Box(0, 1, (16, 20), np.float32),  # rank 2 float: a matrix, not an image
    spaces.Box(0, 255, (3, 3, 3), np.uint8),  # too small to convolve
    spaces.Box(0, 1, (2, 40, 3), np.float32),
])
def test_non_image_boxes_are_flattened_floats(space):
    encoder = ObservationEncoder(space, ())
    assert conv_shapes(encoder) == [] and encoder.output_dim == int(np.prod(space.shape))
    obs = batch_of(space, 2)
    torch.testing.assert_close(encoder(obs), obs[""].reshape(2, -1).float())


def test_uint8_images_are_scaled_to_unit_range_inside_the_network():
    torch.manual_seed(0)
    space = spaces.Box(0, 255, (36, 40, 3), np.uint8)
    encoder = ObservationEncoder(space, (16,))
    seen = []
    first_conv = next(m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    encoder({"": torch.full((2, 36, 40, 3), 255, dtype=torch.uint8)})
    assert seen[0].dtype == torch.float32 and seen[0].shape == (2, 3, 36, 40)
    assert torch.equal(seen[0], torch.ones(2, 3, 36, 40))

    as_float = ObservationEncoder(spaces.Box(0, 1, (36, 40, 3), np.float32), (16,))
    as_float.load_state_dict(encoder.state_dict())
    images = batch_of(space, 4)[""]
    torch.testing.assert_close(encoder({"": images}), as_float({"": images.float() / 255}))


def test_hwc_and_chw_encoders_agree_on_transposed_images():
    torch.manual_seed(0)
    hwc = ObservationEncoder(spaces.Box(0, 1, (10, 12, 4), np.float32), (8,), "hwc")
    chw = ObservationEncoder(spaces.Box(0, 1, (4, 10, 12), np.float32), (8,), "chw")
    chw.load_state_dict(hwc.state_dict())
    images = torch.rand(3, 10, 12, 4)
    torch.testing.assert_close(hwc({"": images}), chw({"": images.permute(0, 3, 1, 2)}))


def test_bool_images_enter_as_zero_and_one():
    encoder = ObservationEncoder(spaces.Box(0, 1, (6, 6), bool), ())
    seen = []
    encoder.leaf_encoders[0].torso[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    image = torch.zeros(1, 6, 6, dtype=torch.bool)
    image[0, 2, 3] = True
    encoder({"": image})
    assert seen[0].shape == (1, 1, 6, 6) and seen[0].sum() == 1 and seen[0][0, 0, 2, 3] == 1


def test_discrete_is_one_hot_from_its_start():
    encoder = ObservationEncoder(spaces.Discrete(3, start=-1), ())
    features = encoder({"": torch.tensor([-1, 0, 1])})
    assert encoder.output_dim == 3
    assert torch.equal(features, torch.eye(3))


def test_multidiscrete_with_start_and_2d_nvec_is_concatenated_one_hots():
    space = spaces.MultiDiscrete([[2, 3], [4, 1]], start=[[-1, 0], [2, 5]])
    encoder = ObservationEncoder(space, ())
    features = encoder({"": torch.tensor([[[0, 2], [3, 5]], [[-1, 0], [5, 5]]])})
    assert encoder.output_dim == 10
    assert features.tolist() == [
        [0, 1, 0, 0, 1, 0, 1, 0, 0, 1],
        [1, 0, 1, 0, 0, 0, 0, 0, 1, 1],
    ]


def test_out_of_range_discrete_values_never_set_a_neighbours_bit():
    encoder = ObservationEncoder(spaces.MultiDiscrete([2, 3]), ())
    assert encoder({"": torch.tensor([[2, 0], [-1, 3]])}).tolist() == [[0, 0, 1, 0, 0], [0, 0, 0, 0, 0]]


def test_multibinary_and_scalar_boxes_are_flat_floats():
    encoder = ObservationEncoder(spaces.Dict([("bits", spaces.MultiBinary([2, 3])),
                                              ("x", spaces.Box(-5, 5, (), np.float64))]), ())
    bits = torch.tensor([[[1, 0, 1], [0, 0, 1]]], dtype=torch.int8)
    features = encoder({"bits": bits, "x": torch.tensor([2.5], dtype=torch.float64)})
    assert features.dtype == torch.float32
    assert features.tolist() == [[1, 0, 1, 0, 0, 1, 2.5]]


def test_leaf_features_are_concatenated_in_leaf_order():
    space = spaces.Dict([("b", spaces.Discrete(2)), ("a", spaces.Box(-1, 1, (2,), np.float32))])
    encoder = ObservationEncoder(space, ())
    features = encoder({"a": torch.tensor([[0.5, -0.5]]), "b": torch.tensor([1])})
    assert features.tolist() == [[0, 1, 0.5, -0.5]]


def test_gradients_reach_every_leaf_encoder():
    torch.manual_seed(0)
    space = spaces.Dict([
        ("image", spaces.Box(0, 255, (8, 8, 2), np.uint8)),
        ("nested", NESTED),
    ])
    encoder = ObservationEncoder(space, (32, 16))
    head = BranchingDuelingHead(encoder.output_dim, (3, 2))
    q = head(encoder(batch_of(space, 8)))
    q[torch.isfinite(q)].square().sum().backward()
    first = encoder.mlp[0].weight.grad
    start = 0
    for key, leaf_encoder in zip(encoder.keys, encoder.leaf_encoders):
        width = leaf_encoder.output_dim
        assert first[:, start:start + width].abs().sum() > 0, key
        start += width
        for parameter in leaf_encoder.parameters():
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, key
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def test_bad_channel_order_is_refused():
    with pytest.raises(ValueError, match="channel_order"):
        ObservationEncoder(spaces.Box(0, 1, (8, 8, 3)), (), "whc")


# --- action branches and the head -----------------------------------------------------------

def test_action_branches_of_discrete_multidiscrete_and_multibinary():
    discrete = action_branches(spaces.Discrete(5, start=2))
    assert (discrete.sizes, discrete.starts, discrete.shape, discrete.dtype) == ((5,), (2,), (), np.int64)
    multi = action_branches(spaces.MultiDiscrete([[2, 3], [4, 1]], start=[[-1, 0], [2, 5]]))
    assert (multi.sizes, multi.starts, multi.shape) == ((2, 3, 4, 1), (-1, 0, 2, 5), (2, 2))
    binary = action_branches(spaces.MultiBinary(3))
    assert (binary.sizes, binary.starts, binary.shape, binary.dtype) == ((2, 2, 2), (0, 0, 0), (3,), np.int8)


@pytest.mark.parametrize("space", [
    spaces.Discrete(5, start=2),
    spaces.MultiDiscrete([[2, 3], [4, 1]], start=[[-1, 0], [2, 5]]),
    spaces.MultiBinary([2, 2]),
    DictWalkEnv().action_space,
])
def test_indices_round_trip_to_actions(space):
    branches = action_branches(space)
    space.seed(0)
    actions = np.stack([space.sample() for _ in range(16)])
    indices = branches.to_indices(torch.as_tensor(actions))
    assert indices.dtype == torch.long and indices.shape == (16, len(branches.sizes))
    assert (indices >= 0).all() and (indices < torch.tensor(branches.sizes)).all()
    back = branches.from_indices(indices)
    assert back.dtype == space.dtype and back.shape == actions.shape
    np.testing.assert_array_equal(back, actions)
    assert all(space.contains(action) for action in back)
    np.testing.assert_array_equal(branches.from_indices(indices.numpy()), actions)


@pytest.mark.parametrize(("space", "named"), [
    (spaces.Box(-1, 1, (2,)), "continuous actions are not supported by this algorithm yet"),
    (spaces.Dict({"a": spaces.Discrete(2)}), "Dict('a': Discrete(2))"),
    (spaces.Tuple((spaces.Discrete(2),)), "Tuple(Discrete(2))"),
    (spaces.Text(4), "Text("),
    (spaces.MultiDiscrete(np.zeros(0, np.int64)), "MultiDiscrete([])"),
], ids=lambda v: type(v).__name__)
def test_unsupported_action_spaces_raise_naming_them(space, named):
    with pytest.raises(UnsupportedSpace, match=r"^action space ") as caught:
        action_branches(space)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_head_pads_short_branches_with_minus_infinity():
    torch.manual_seed(0)
    head = BranchingDuelingHead(6, (2, 4, 1))
    q = head(torch.randn(5, 6))
    assert q.shape == (5, 3, 4)
    valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool).expand(5, 3, 4)
    assert torch.isfinite(q[valid]).all() and (q[~valid] == float("-inf")).all()
    assert (q.argmax(-1) < torch.tensor([2, 4, 1])).all()


def test_dueling_q_is_value_plus_mean_zero_advantage_per_branch():
    torch.manual_seed(0)
    sizes = (2, 4, 1)
    head = BranchingDuelingHead(6, sizes)
    h = torch.randn(5, 6)
    q = head(h)
    value = head.value(h)[:, 0]
    advantages = head.advantages(h).split(sizes, dim=1)
    for d, (size, advantage) in enumerate(zip(sizes, advantages)):
        torch.testing.assert_close(q[:, d, :size].mean(-1), value)
        torch.testing.assert_close(q[:, d, :size], value[:, None] + advantage - advantage.mean(-1, keepdim=True))


def test_without_dueling_q_is_each_branchs_advantage():
    torch.manual_seed(0)
    head = BranchingDuelingHead(6, (3, 2), dueling=False)
    h = torch.randn(4, 6)
    a = head.advantages(h)
    q = head(h)
    assert head.value is None
    torch.testing.assert_close(q[:, 0, :3], a[:, :3])
    torch.testing.assert_close(q[:, 1, :2], a[:, 3:])


def test_one_discrete_branch_gives_b_by_1_by_n():
    h = torch.randn(3, 8)
    for dueling in (True, False):
        head = BranchingDuelingHead(8, action_branches(spaces.Discrete(6)).sizes, dueling)
        q, a = head(h), head.advantages(h)
        assert q.shape == (3, 1, 6)
        want = head.value(h) + a - a.mean(-1, keepdim=True) if dueling else a
        torch.testing.assert_close(q[:, 0], want)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_encoder_and_head_on_cuda_match_cpu():
    torch.manual_seed(0)
    space = spaces.Dict([("image", spaces.Box(0, 255, (40, 40, 3), np.uint8)), ("nested", NESTED)])
    encoder = ObservationEncoder(space, (32,))
    head = BranchingDuelingHead(encoder.output_dim, (3, 5))
    obs = batch_of(space, 4)
    expected = head(encoder(obs))
    encoder.cuda()
    head.cuda()
    q = head(encoder({key: value.cuda() for key, value in obs.items()}))
    assert q.device.type == "cuda"
    torch.testing.assert_close(q.cpu(), expected, rtol=1e-4, atol=1e-4)
