"""Sequences for recurrent agents: overlap, padding and masks at episode ends, stored states, autoreset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from actorlearner.algorithms.sequence import SequenceAssembler, sequence_fields

OBS = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
GAMMA = 0.5  # exact in float32


class CountingMemory:
    """A stand-in recurrent state that counts the steps acted since its last reset: state == steps seen."""

    def __init__(self, num_envs: int):
        self.state = np.zeros((num_envs, 1), np.float32)
        self.before = self.state.copy()

    def act(self) -> None:
        self.before = self.state.copy()
        self.state = self.state + 1

    def acted_from(self) -> dict[str, np.ndarray]:
        return {"h": self.before}

    def reset(self, envs: np.ndarray) -> None:
        self.state[envs] = 0


def drive(assembler, memory, episode_lengths: list[int], steps: int, terminate: bool = True) -> list[dict]:
    """Step a NEXT_STEP-autoreset vector env by hand: env e's episodes last episode_lengths[e] steps.
    Observations are [episode index, step in episode]; actions and rewards are the step in the episode."""
    num_envs = len(episode_lengths)
    t = np.zeros(num_envs, np.int64)
    episode = np.zeros(num_envs, np.int64)
    pending_reset = np.zeros(num_envs, bool)
    out = []
    obs = np.stack([episode, t], 1).astype(np.float32)
    for _ in range(steps):
        memory.act()
        action = t.copy()
        reward = t.astype(np.float32)
        lengths = np.asarray(episode_lengths)
        done = ~pending_reset & (t + 1 >= lengths)
        next_t = np.where(pending_reset, 0, t + 1)
        episode = np.where(pending_reset, episode + 1, episode)
        next_obs = np.stack([episode, next_t], 1).astype(np.float32)
        reward = np.where(pending_reset, 0.0, reward).astype(np.float32)
        items = assembler.push(obs, action, reward, done & terminate, done & ~terminate, next_obs)
        if items is not None:
            out += [{k: v[i] for k, v in items.items()} for i in range(len(items["mask"]))]
        memory.reset(pending_reset)  # as the actor does after an autoreset step (the algorithm's reset_memory)
        pending_reset = done
        t, obs = next_t, next_obs
    return out


def make(num_envs: int, length: int = 4, overlap: int = 2):
    memory = CountingMemory(num_envs)
    return SequenceAssembler(num_envs, length, overlap, GAMMA, OBS, (), np.int64, memory, {"h": (1,)}), memory


def test_fields_store_each_observation_once():
    fields = sequence_fields(OBS, 80, (), torch.int64, {"h": (64,), "c": (64,)})
    assert fields["obs"] == ((81, 2), torch.float32) and "next_obs" not in fields
    assert fields["mask"] == ((80,), torch.bool) and fields["state/c"] == ((64,), torch.float32)


def test_long_episodes_give_overlapping_full_sequences_with_their_stored_states():
    assembler, memory = make(1, length=4, overlap=2)
    items = drive(assembler, memory, [100], steps=8)
    # full sequences start at steps 0, 2, 4 (each holds 4 steps and the observation after them)
    assert [item["obs"][0, 1] for item in items] == [0, 2, 4]
    for item in items:
        start = int(item["obs"][0, 1])
        np.testing.assert_array_equal(item["obs"][:, 1], np.arange(start, start + 5))
        np.testing.assert_array_equal(item["action"], np.arange(start, start + 4))
        assert item["mask"].all() and (item["discount"] == np.float32(GAMMA)).all()
        assert item["state/h"][0] == start  # the state the first step was acted from
    assert [bool(item["first"]) for item in items] == [True, False, False]


def test_an_episode_end_pads_the_sequence_and_the_next_episode_starts_fresh():
    assembler, memory = make(1, length=4, overlap=2)
    items = drive(assembler, memory, [3], steps=8)  # episodes of 3 steps, then an autoreset step each
    first, second = items[0], items[1]
    np.testing.assert_array_equal(first["mask"], [True, True, True, False])
    np.testing.assert_array_equal(first["obs"][:, 1], [0, 1, 2, 3, 0])  # slot 3: the final observation; then zeros
    np.testing.assert_array_equal(first["discount"], [GAMMA, GAMMA, 0.0, 0.0])  # terminated at its last step
    np.testing.assert_array_equal(first["reward"], [0, 1, 2, 0])
    assert second["obs"][0, 0] == 1 and second["obs"][0, 1] == 0  # episode 1 from its first observation
    assert second["first"] and second["state/h"][0] == 0  # stored: the state reset before the new episode


def test_truncation_keeps_the_discount_for_a_bootstrap_from_the_final_observation():
    assembler, memory = make(1, length=4, overlap=2)
    item = drive(assembler, memory, [3], steps=4, terminate=False)[0]
    np.testing.assert_array_equal(item["discount"][:3], [GAMMA] * 3)
    assert item["obs"][3, 1] == 3


def test_envs_are_independent_and_flush_cuts_what_is_under_way():
    assembler, memory = make(3, length=4, overlap=1)
    items = drive(assembler, memory, [2, 5, 100], steps=3)
    assert sorted((int(i["obs"][0, 0]), int(i["mask"].sum())) for i in items) == [(0, 2)]
    flushed = assembler.flush()
    assert sorted(flushed["mask"].sum(1).tolist()) == [3, 3]  # envs 1 and 2, three steps each
    assert flushed["first"].all()  # both began with their episodes
    assert assembler.flush() is None
