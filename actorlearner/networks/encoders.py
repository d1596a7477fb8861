"""Observation encoders built from a gymnasium space: one encoder per leaf, then an MLP.

Observations arrive as ``{leaf_key: Tensor[B, *leaf_shape]}`` in their stored dtypes (uint8
stays uint8); every conversion to float happens inside the network, on its device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import Tensor, nn

from actorlearner.networks.leaves import leaf_spaces

CHANNEL_ORDERS = ("auto", "hwc", "chw")
MIN_IMAGE_SIDE = 4
"""Smallest height and width treated as an image (below it a Box is flattened)."""
NATURE_MIN_SIDE = 36
"""Smallest height and width that gets the Nature-DQN torso (below it the small MinAtar torso)."""


def image_layout(box: spaces.Box, channel_order: str = "auto") -> tuple[int, int, int, bool] | None:
    """(channels, height, width, channels_last) when ``box`` is an image, else None.

    Rank 3 is HWC or CHW: ``channel_order`` forces the channel axis, "auto" takes the smaller
    of the first and last dims (ties: last). Rank 2 uint8/bool is a one-channel HW image.
    """
    shape = box.shape
    if len(shape) == 2 and box.dtype in (np.uint8, np.bool_):
        channels, (height, width), channels_last = 1, shape, True
    elif len(shape) == 3:
        channels_last = channel_order == "hwc" or (channel_order == "auto" and shape[2] <= shape[0])
        channels, height, width = (shape[2], shape[0], shape[1]) if channels_last else shape
    else:
        return None
    if min(height, width) < MIN_IMAGE_SIDE:
        return None
    return channels, height, width, channels_last


def conv_torso(channels: int, height: int, width: int) -> nn.Sequential:
    """The Nature-DQN torso for images at least 36x36, else one 16-filter 3x3 layer (MinAtar)."""
    if min(height, width) >= NATURE_MIN_SIDE:
        return nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
    return nn.Sequential(nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())


def bound(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """``module``'s forward as a function of the parameter tensors it holds now: Linear, ReLU, FlatEncoder and
    Sequentials of them as the functions they are, anything else as the module itself.

    For acting, where a few rows make a module call and an attribute lookup cost about what a small
    layer computes. Loading weights copies into the same tensors, so the function follows it; moving
    the module to another device does not.
    """
    if type(module) is nn.Linear:
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    if type(module) is nn.ReLU:
        return torch.relu
    if type(module) is FlatEncoder:
        width = module.output_dim
        return lambda x: x.reshape(x.shape[0], width).to(torch.float32)
    if type(module) is nn.Sequential:
        layers = [bound(layer) for layer in module]

        def run(x: Tensor) -> Tensor:
            for layer in layers:
                x = layer(x)
            return x
        return run
    return module


class ImageEncoder(nn.Module):
    """An image leaf through a conv torso; uint8 scaled to [0, 1], bool to 0/1."""

    def __init__(self, box: spaces.Box, layout: tuple[int, int, int, bool]):
        super().__init__()
        channels, height, width, self.channels_last = layout
        self.uint8 = box.dtype == np.uint8
        self.rank = len(box.shape)
        self.torso = conv_torso(channels, height, width)
        with torch.no_grad():
            self.output_dim = self.torso(torch.zeros(1, channels, height, width)).shape[1]

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.float32)
        if self.uint8:
            x = x / 255
        if self.rank == 2:
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.torso(x)


class FlatEncoder(nn.Module):
    """A non-image Box or MultiBinary leaf as its float32 values, flattened."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.output_dim = int(np.prod(shape))

    def forward(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], self.output_dim).to(torch.float32)


class OneHotEncoder(nn.Module):
    """Discrete or MultiDiscrete (any shape): one one-hot of ``x - start`` per element, concatenated.

    An element outside its range gets an all-zero one-hot (never a bit in its neighbour's).
    """

    def __init__(self, nvec: np.ndarray, start: np.ndarray):
        super().__init__()
        self.register_buffer("sizes", torch.as_tensor(np.asarray(nvec).reshape(-1), dtype=torch.long), persistent=False)
        self.register_buffer("starts", torch.as_tensor(np.asarray(start).reshape(-1), dtype=torch.long), persistent=False)
        self.register_buffer("offsets", torch.cumsum(self.sizes, 0) - self.sizes, persistent=False)
        self.output_dim = int(self.sizes.sum())

    def forward(self, x: Tensor) -> Tensor:
        local = x.reshape(x.shape[0], -1).long() - self.starts
        inside = (local >= 0) & (local < self.sizes)
        columns = torch.where(inside, local + self.offsets, 0)
        features = torch.zeros(x.shape[0], self.output_dim, dtype=torch.float32, device=x.device)
        return features.scatter_add_(1, columns, inside.to(torch.float32))


def leaf_encoder(leaf: gym.Space, channel_order: str) -> nn.Module:
    """The encoder of one supported leaf space."""
    if isinstance(leaf, spaces.Discrete):
        return OneHotEncoder(np.array([leaf.n]), np.array([leaf.start]))
    if isinstance(leaf, spaces.MultiDiscrete):
        return OneHotEncoder(leaf.nvec, leaf.start)
    layout = image_layout(leaf, channel_order) if isinstance(leaf, spaces.Box) else None
    return ImageEncoder(leaf, layout) if layout else FlatEncoder(leaf.shape)


class ObservationEncoder(nn.Module):
    """Any supported observation space -> float32 features ``[B, output_dim]``.

    Each leaf is encoded (images by a conv torso, Discrete/MultiDiscrete one-hot, other Box
    and MultiBinary flattened), the features are concatenated in leaf order, then an MLP
    with ``hidden_sizes`` (Linear+ReLU each). ``output_dim`` is the last hidden size, or the
    concatenated width when ``hidden_sizes`` is empty.
    """

    def __init__(self, space: gym.Space, hidden_sizes: tuple[int, ...], channel_order: str = "auto"):
        super().__init__()
        if channel_order not in CHANNEL_ORDERS:
            raise ValueError(f"channel_order {channel_order!r}: use one of {', '.join(CHANNEL_ORDERS)}")
        leaves = leaf_spaces(space)
        self.keys = tuple(leaves)
        self.leaf_encoders = nn.ModuleList(leaf_encoder(leaf, channel_order) for leaf in leaves.values())
        width = sum(encoder.output_dim for encoder in self.leaf_encoders)
        layers = []
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.mlp = nn.Sequential(*layers)
        self.output_dim = width

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        features = [encoder(obs[key]) for key, encoder in zip(self.keys, self.leaf_encoders)]
        return self.mlp(features[0] if len(features) == 1 else torch.cat(features, dim=1))

    def function(self) -> Callable[[Mapping[str, Tensor]], Tensor]:
        """`forward` as a function of the parameters held now (see `bound`)."""
        leaves, mlp = [(key, bound(encoder)) for key, encoder in zip(self.keys, self.leaf_encoders)], bound(self.mlp)
        if len(leaves) == 1:
            (key, leaf), = leaves
            return lambda obs: mlp(leaf(obs[key]))
        return lambda obs: mlp(torch.cat([leaf(obs[key]) for key, leaf in leaves], dim=1))
