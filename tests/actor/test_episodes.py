"""EpisodeTally: episode returns and lengths of a vector env in next-step autoreset mode (the step after
an episode ends only resets that env and counts for nothing), by hand and against a per-env reference."""

from __future__ import annotations

import numpy as np
import pytest

from actorlearner.actor.episodes import EpisodeTally


def step(tally: EpisodeTally, rewards, terminated=None, truncated=None):
    """One vector step; flags default to all False. Returns (real env steps, resets as a list of bools)."""
    n = tally.num_envs
    terminated = np.zeros(n, bool) if terminated is None else np.asarray(terminated, bool)
    truncated = np.zeros(n, bool) if truncated is None else np.asarray(truncated, bool)
    count, resets = tally.step(np.asarray(rewards, np.float64), terminated, truncated)
    return count, np.asarray(resets, bool).tolist()


def test_one_env_episode_return_and_length_then_the_reset_step_counts_nothing():
    tally = EpisodeTally(1)
    assert step(tally, [1.0]) == (1, [False])
    assert step(tally, [2.0]) == (1, [False])
    assert step(tally, [4.0], terminated=[True]) == (1, [False])
    assert tally.finished_returns == [7.0] and tally.finished_lengths == [3]
    assert tally.last_return == 7.0
    # The autoreset step: no env step, reported as a reset; its reward (gymnasium gives 0) is not counted.
    assert step(tally, [100.0]) == (0, [True])
    assert tally.finished_returns == [7.0]
    assert step(tally, [0.5]) == (1, [False])
    assert step(tally, [0.25], truncated=[True]) == (1, [False])
    assert tally.finished_returns == [7.0, 0.75] and tally.finished_lengths == [3, 2]
    assert tally.last_return == 0.75
    assert step(tally, [0.0]) == (0, [True])
    assert tally.steps == 5


def test_last_return_is_nan_before_any_episode_and_a_one_step_episode_has_length_one():
    tally = EpisodeTally(2)
    assert np.isnan(tally.last_return)
    assert step(tally, [3.0, -1.0], terminated=[False, True]) == (2, [False, False])
    assert tally.finished_returns == [-1.0] and tally.finished_lengths == [1]
    assert step(tally, [1.0, 9.0], terminated=[False, True]) == (1, [False, True])  # env 1's flag ignored: a reset
    assert tally.finished_returns == [-1.0] and tally.finished_lengths == [1]
    assert step(tally, [1.0, 2.0], truncated=[True, True]) == (2, [False, False])
    assert tally.finished_returns == [-1.0, 5.0, 2.0] and tally.finished_lengths == [1, 3, 1]


def test_envs_out_of_phase():
    """env0 ends at step 1, env1 at step 2 (terminated and truncated both), env2 at step 2 and 4."""
    tally = EpisodeTally(3)
    assert step(tally, [1, 10, 100]) == (3, [False] * 3)
    assert step(tally, [2, 20, 200], terminated=[1, 0, 0]) == (3, [False] * 3)
    assert (tally.finished_returns, tally.finished_lengths) == ([3.0], [2])
    assert step(tally, [-5, 30, 300], terminated=[0, 1, 0], truncated=[0, 1, 1]) == (2, [True, False, False])
    assert (tally.finished_returns, tally.finished_lengths) == ([3.0, 60.0, 600.0], [2, 3, 3])
    assert step(tally, [4, -7, -7]) == (1, [False, True, True])
    assert step(tally, [5, 1, 1], truncated=[0, 0, 1]) == (3, [False] * 3)
    assert (tally.finished_returns, tally.finished_lengths) == ([3.0, 60.0, 600.0, 1.0], [2, 3, 3, 1])
    assert step(tally, [6, 2, -9]) == (2, [False, False, True])
    np.testing.assert_array_equal(tally.returns, [15.0, 3.0, 0.0])  # episodes under way
    np.testing.assert_array_equal(tally.lengths, [3, 2, 0])
    assert tally.steps == 3 + 3 + 2 + 1 + 3 + 2


def test_take_returns_and_resets_the_counters_but_not_the_episodes_under_way():
    tally = EpisodeTally(2)
    step(tally, [1.0, 1.0], terminated=[True, False])
    assert tally.take() == ([1.0], [1], 2)
    assert tally.take() == ([], [], 0)
    assert step(tally, [5.0, 2.0], truncated=[False, True]) == (1, [True, False])  # reset state survives take
    assert tally.take() == ([3.0], [2], 1)  # env1's episode started before the previous take
    assert step(tally, [1.0, 1.0]) == (1, [False, True])
    returns, lengths, steps = tally.take()
    assert (returns, lengths, steps) == ([], [], 1)
    assert tally.last_return == 3.0  # last_return is not a counter: take keeps it
    returns.append(99.0)  # what take handed out is the caller's: the tally does not reuse it
    step(tally, [1.0, 1.0], terminated=[True, False])
    assert tally.take() == ([2.0], [2], 2)


class ReferenceTally:
    """Per-env, per-step Python: an env that ended last step resets now and counts for nothing."""

    def __init__(self, num_envs: int):
        self.returns = [0.0] * num_envs
        self.lengths = [0] * num_envs
        self.resetting = [False] * num_envs
        self.finished: list[tuple[float, int]] = []
        self.steps = 0

    def step(self, rewards, terminated, truncated) -> tuple[int, list[bool]]:
        count, resets = 0, []
        for i, (reward, term, trunc) in enumerate(zip(rewards, terminated, truncated)):
            resets.append(self.resetting[i])
            if self.resetting[i]:
                self.resetting[i] = False
                continue
            count += 1
            self.returns[i] += float(reward)
            self.lengths[i] += 1
            if term or trunc:
                self.finished.append((self.returns[i], self.lengths[i]))
                self.returns[i], self.lengths[i], self.resetting[i] = 0.0, 0, True
        self.steps += count
        return count, resets

    def take(self):
        taken = [r for r, _ in self.finished], [n for _, n in self.finished], self.steps
        self.finished, self.steps = [], 0
        return taken


def scripted_steps(rng: np.random.Generator, num_envs: int, num_steps: int, max_length: int):
    """Random episodes per env as a next-step autoreset vector env reports them: each episode lasts 1 to
    ``max_length`` steps and ends terminated, truncated or both; the step after it is the reset (flags False,
    a nonzero reward that must not count, so a tally that counted it would show)."""
    rewards = rng.normal(size=(num_steps, num_envs))
    terminated = np.zeros((num_steps, num_envs), bool)
    truncated = np.zeros((num_steps, num_envs), bool)
    for i in range(num_envs):
        t = 0
        while t < num_steps:
            t += int(rng.integers(1, max_length + 1)) - 1  # the episode's last step
            if t >= num_steps:
                break
            how = rng.integers(3)
            terminated[t, i], truncated[t, i] = how in (0, 2), how in (1, 2)
            if t + 1 < num_steps:
                rewards[t + 1, i] = 1000.0 + rng.normal()
            t += 2  # past the reset step
    return rewards, terminated, truncated


@pytest.mark.parametrize("seed", range(5))
def test_against_a_per_env_reference_on_random_episodes(seed):
    rng = np.random.default_rng(seed)
    num_envs, num_steps = 5, 400
    rewards, terminated, truncated = scripted_steps(rng, num_envs, num_steps, max_length=int(rng.integers(2, 12)))
    tally, reference = EpisodeTally(num_envs), ReferenceTally(num_envs)
    takes = set(rng.choice(num_steps, size=20, replace=False).tolist())
    finished = []
    for t in range(num_steps):
        assert step(tally, rewards[t], terminated[t], truncated[t]) == reference.step(
            rewards[t], terminated[t], truncated[t]), f"step {t}"
        np.testing.assert_allclose(tally.returns, reference.returns, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(tally.lengths, reference.lengths)
        if t in takes or t == num_steps - 1:
            (returns, lengths, steps), (ref_returns, ref_lengths, ref_steps) = tally.take(), reference.take()
            np.testing.assert_allclose(returns, ref_returns, rtol=1e-12, atol=1e-12)
            assert lengths == ref_lengths and steps == ref_steps, f"take after step {t}"
            finished += lengths
            assert all(r < 500 for r in returns), "a reset step's reward was counted"
    # The script exercised what it is for: many episodes, some of length 1, several envs ending together.
    ends = terminated | truncated
    assert len(finished) == int(ends.sum()) > 50
    assert min(finished) == 1
    assert (ends.sum(axis=1) >= 2).any()
