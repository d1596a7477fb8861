"""evaluate(): even spread of episodes over envs, seeding, statistics, on real gymnasium envs."""

import gymnasium as gym
import numpy as np
import pytest

from actorlearner.evaluation import EvalResult, episode_shares, evaluate


class StairsEnv(gym.Env):
    """Deterministic: after ``reset(seed=s)``, episode k lasts ``(s + 1) * (k + 1)`` steps.

    Reward per step is the action taken, so a return shows which actions the policy chose.
    """

    observation_space = gym.spaces.Box(0.0, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(4)

    def __init__(self) -> None:
        self.base = 1
        self.episode = -1
        self.remaining = 0
        self.resets = 0
        self.total_steps = 0
        self.closed = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.base, self.episode = seed + 1, -1
        self.episode += 1
        self.resets += 1
        self.remaining = self.base * (self.episode + 1)
        return self._obs(), {}

    def step(self, action):
        assert self.remaining > 0, "stepped after the episode ended"
        self.remaining -= 1
        self.total_steps += 1
        return self._obs(), float(action), self.remaining == 0, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.base, self.remaining], np.float32)

    def close(self) -> None:
        self.closed = True


def stairs_factory():
    created: list[StairsEnv] = []

    def make_env() -> StairsEnv:
        created.append(StairsEnv())
        return created[-1]

    return make_env, created


def test_episode_shares_are_even():
    assert episode_shares(7, 3) == [3, 2, 2]
    assert episode_shares(6, 3) == [2, 2, 2]
    assert episode_shares(2, 4) == [1, 1, 0, 0]
    with pytest.raises(ValueError):
        episode_shares(0, 2)


def test_short_episodes_do_not_dominate():
    make_env, envs = stairs_factory()
    batch_sizes = []

    def act(obs: np.ndarray) -> np.ndarray:
        batch_sizes.append(len(obs))
        return np.full(len(obs), 2)

    result = evaluate(act, make_env, episodes=7, num_envs=3, seed=0)

    # Env i (seed i) has episodes of length (i+1), 2(i+1), ...; shares are 3, 2, 2.
    assert result.lengths == (1, 2, 3, 2, 4, 3, 6)
    assert result.returns == tuple(2.0 * n for n in result.lengths)
    assert result.episodes == 7
    # Each env ran exactly its share and was never stepped after it.
    assert [env.resets for env in envs] == [3, 2, 2]
    assert [env.total_steps for env in envs] == [6, 6, 9]
    assert all(env.closed for env in envs)
    assert set(batch_sizes) == {3}  # Row i is always env i; a finished env's action is dropped.


def test_a_recurrent_policy_is_told_where_episodes_begin():
    make_env, _ = stairs_factory()
    begun = []
    evaluate(lambda obs: np.full(len(obs), 2), make_env, episodes=7, num_envs=3, seed=0,
             reset_memory=lambda envs: begun.append(envs.copy()))
    assert begun[0].tolist() == [True, True, True]  # every env's first episode
    assert np.sum(begun, axis=0).tolist() == [3, 2, 2]  # each episode begins once: the shares


def test_statistics():
    make_env, _ = stairs_factory()
    result = evaluate(lambda obs: np.ones(len(obs), np.int64), make_env, episodes=7, num_envs=3, seed=0)
    returns = np.array([1, 2, 3, 2, 4, 3, 6], np.float64)
    assert result.mean == pytest.approx(returns.mean())
    assert result.std == pytest.approx(returns.std())
    assert (result.min, result.max) == (1.0, 6.0)


def test_seed_offsets_every_env_and_extra_envs_are_not_created():
    make_env, envs = stairs_factory()
    result = evaluate(lambda obs: np.ones(len(obs), np.int64), make_env, episodes=2, num_envs=5, seed=10)
    assert len(envs) == 2
    assert result.lengths == (11, 12)


def test_policy_must_return_one_action_per_observation():
    make_env, envs = stairs_factory()
    with pytest.raises(ValueError, match="shape"):
        evaluate(lambda obs: np.ones(1, np.int64), make_env, episodes=4, num_envs=2, seed=0)
    assert all(env.closed for env in envs)


def test_envs_made_before_a_failing_one_are_closed():
    make_env, envs = stairs_factory()

    def third_fails() -> StairsEnv:
        if len(envs) == 2:
            raise RuntimeError("env server at its session cap")
        return make_env()

    with pytest.raises(RuntimeError, match="session cap"):
        evaluate(lambda obs: np.ones(len(obs), np.int64), third_fails, episodes=4, num_envs=4, seed=0)
    assert len(envs) == 2 and all(env.closed for env in envs)


def balance(obs: np.ndarray) -> np.ndarray:
    """A crude greedy CartPole policy: push towards the side the pole leans to."""
    return (obs[:, 2] > 0).astype(np.int64)


def test_cartpole_is_deterministic_per_seed():
    make_env = lambda: gym.make("CartPole-v1")  # noqa: E731
    first = evaluate(balance, make_env, episodes=6, num_envs=3, seed=0)
    again = evaluate(balance, make_env, episodes=6, num_envs=3, seed=0)
    other = evaluate(balance, make_env, episodes=6, num_envs=3, seed=100)
    assert isinstance(first, EvalResult)
    assert first == again
    assert first.lengths != other.lengths
    assert first.episodes == 6
    assert first.returns == tuple(map(float, first.lengths))  # CartPole pays 1 per step.
    assert first.min <= first.mean <= first.max
    assert first.std == pytest.approx(np.std(first.returns))
    assert 8 <= first.min and first.max <= 500


def test_max_steps_cuts_an_episode_that_would_run_on_and_counts_its_return_so_far():
    """Env 2's episodes last 3, 6, 9 steps: cut at 4, the 6- and 9-step ones count 4 steps (a greedy policy that
    never ends an episode, as in MinAtar Seaquest, no longer stalls an evaluation)."""
    make_env, envs = stairs_factory()
    result = evaluate(lambda obs: np.ones(len(obs), np.int64), make_env, episodes=9, num_envs=3, seed=0, max_steps=4)
    assert result.lengths == (1, 2, 3, 2, 4, 4, 3, 4, 4)
    assert result.returns == tuple(float(n) for n in result.lengths)
    assert [env.total_steps for env in envs] == [6, 10, 11]
