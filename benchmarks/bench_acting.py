"""Acting on the CPU: DQN's policy against a plain torch Q network, a few observations at a time.

An actor or an env loop acts on its envs' observations (1 to 16 rows), the learner's evaluation on its
eval envs', a self-play opponent on one observation per move. Ours: ``DQNPolicy.act`` (epsilon-greedy,
exploration 0.05) with the default network, and a league opponent's ``PolicyPlayer.act``. Baseline, as a
user would write it: an ``nn.Sequential`` MLP of the same sizes (dueling head alike), ``torch.no_grad``, the
observation as a tensor, argmax and the same epsilon-greedy in numpy. Both on one torch thread; the figure
is microseconds per call, median of ``--repeats`` passes, and baseline / ours (above 1: ours is faster).

    python benchmarks/bench_acting.py --calls 3000 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorlearner.algorithms.dqn import DQN, DQNConfig
from actorlearner.envs.multiagent import shared_spaces
from actorlearner.envs.tictactoe import tic_tac_toe
from actorlearner.league.opponents import PolicyPlayer


class PlainQ(nn.Module):
    """A dueling MLP Q network as a user writes it."""

    def __init__(self, inputs: int, hidden: tuple[int, ...], actions: int):
        super().__init__()
        layers, width = [], inputs
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.torso, self.value, self.advantages = nn.Sequential(*layers), nn.Linear(width, 1), nn.Linear(width, actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.torso(x)
        a = self.advantages(h)
        return self.value(h) + a - a.mean(1, keepdim=True)


def plain_act(network: PlainQ, rng: np.random.Generator, actions: int, exploration: float):
    """Epsilon-greedy on ``network``; with a ``legal`` mask [E, N], over the legal actions only."""
    def act(obs: np.ndarray, legal: np.ndarray | None = None) -> np.ndarray:
        with torch.no_grad():
            q = network(torch.as_tensor(obs, dtype=torch.float32))
            if legal is not None:
                q = q.masked_fill(torch.as_tensor(legal) < 0.5, -torch.inf)
            greedy = q.argmax(1).numpy()
        explore = rng.random(len(greedy)) < exploration
        if legal is None:
            return np.where(explore, rng.integers(0, actions, len(greedy)), greedy)
        return np.where(explore, (rng.random(legal.shape) * legal).argmax(1), greedy)
    return act


def per_call(fn, calls: int, repeats: int) -> float:
    """Median microseconds per call over ``repeats`` passes of ``calls`` calls, after a warm-up pass."""
    for _ in range(calls // 10):
        fn()
    passes = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        passes.append((time.perf_counter() - began) / calls * 1e6)
    return statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000, help="calls per timed pass")
    parser.add_argument("--repeats", type=int, default=7, help="timed passes per figure (the median is reported)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    config = DQNConfig()  # (128, 128) hidden layers, dueling
    cartpole = gym.make("CartPole-v1")
    board_space, board_actions = shared_spaces(tic_tac_toe())
    print("| network | rows | ours (us) | plain torch (us) | plain / ours |\n|---|---:|---:|---:|---:|")
    for name, space, action_space in (("CartPole-v1", cartpole.observation_space, cartpole.action_space),
                                      ("tic-tac-toe (board + action mask)", board_space, board_actions)):
        policy = DQN(space, action_space, config).make_policy()
        inputs = gym.spaces.flatdim(space)
        network = PlainQ(gym.spaces.flatdim(space), config.hidden_sizes, action_space.n)
        masked = isinstance(space, gym.spaces.Dict)
        for rows in (1, 4, 10, 16):
            observations = [space.sample() for _ in range(rows)]
            batch = gym.vector.utils.concatenate(space, observations, gym.vector.utils.create_empty_array(space, rows))
            flat = np.stack([gym.spaces.flatten(space, o) for o in observations]).astype(np.float32)
            legal = batch["action_mask"] if masked else None
            plain = plain_act(network, rng, action_space.n, 0.05)
            ours = per_call(lambda: policy.act(batch, 0.05), args.calls, args.repeats)
            theirs = per_call(lambda: plain(flat, legal), args.calls, args.repeats)
            print(f"| {name} | {rows} | {ours:.1f} | {theirs:.1f} | **{theirs / ours:.2f}** |", flush=True)
        if masked:  # a league opponent's move: one observation, exploration 0.2
            player, plain = PolicyPlayer("self", policy, space, 0.2), plain_act(network, rng, action_space.n, 0.2)
            observation = space.sample()
            single = gym.spaces.flatten(space, observation).astype(np.float32)[None]
            ours = per_call(lambda: player.act(observation), args.calls, args.repeats)
            theirs = per_call(lambda: plain(single, observation["action_mask"][None]), args.calls, args.repeats)
            print(f"| {name}: a league opponent's move | 1 | {ours:.1f} | {theirs:.1f} | **{theirs / ours:.2f}** |")


if __name__ == "__main__":
    main()
