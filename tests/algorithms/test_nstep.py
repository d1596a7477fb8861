"""NStepAssembler: exact n-step sums, discounts and next_obs on hand-made vector-env steps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from actorlearner.algorithms.nstep import NStepAssembler


def box(size: int) -> gym.spaces.Box:
    """An unbounded float32 vector observation space of ``size``."""
    return gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

N, G = 3, 0.5
FIELDS = {"obs", "action", "reward", "discount", "next_obs"}


def step1(asm: NStepAssembler, t: int, reward: float, terminated=False, truncated=False, next_t=None):
    """Push one step of a single env whose observation is [t] and action is t."""
    next_t = t + 1 if next_t is None else next_t
    return asm.push(
        np.array([[t]], np.float32),
        np.array([t]),
        np.array([reward]),
        np.array([terminated]),
        np.array([truncated]),
        np.array([[next_t]], np.float32),
    )


def assert_transitions(out, obs, reward, discount, next_obs):
    assert out is not None and set(out) == FIELDS
    np.testing.assert_array_equal(out["obs"][:, 0], obs)
    np.testing.assert_array_equal(out["action"], np.asarray(obs, np.int64))
    np.testing.assert_allclose(out["reward"], reward, rtol=1e-6)
    np.testing.assert_allclose(out["discount"], discount, rtol=1e-6)
    np.testing.assert_array_equal(out["next_obs"][:, 0], next_obs)
    assert out["reward"].dtype == out["discount"].dtype == out["obs"].dtype == np.float32
    assert out["action"].dtype == np.int64


def test_mid_episode_windows_sum_n_rewards_and_bootstrap_with_gamma_n():
    asm = NStepAssembler(num_envs=1, n_step=N, gamma=G, observation_space=box(1))
    assert step1(asm, 0, 1.0) is None
    assert step1(asm, 1, 2.0) is None
    assert_transitions(step1(asm, 2, 3.0), [0], [1 + 0.5 * 2 + 0.25 * 3], [0.125], [3])
    assert_transitions(step1(asm, 3, 4.0), [1], [2 + 0.5 * 3 + 0.25 * 4], [0.125], [4])
    assert_transitions(step1(asm, 4, 5.0), [2], [3 + 0.5 * 4 + 0.25 * 5], [0.125], [5])
    np.testing.assert_array_equal(asm.pending, [2])


def test_termination_flushes_all_windows_with_zero_discount_then_skips_autoreset_step():
    asm = NStepAssembler(1, N, G, box(1))
    for t in range(4):
        step1(asm, t, t + 1.0)
    out = step1(asm, 4, 5.0, terminated=True)
    assert_transitions(out, [2, 3, 4], [3 + 2 + 1.25, 4 + 2.5, 5], [0, 0, 0], [5, 5, 5])
    np.testing.assert_array_equal(asm.pending, [0])
    # NEXT_STEP autoreset: action ignored, reward 0, flags False, next_obs is the reset obs.
    assert step1(asm, 5, 0.0, next_t=100) is None
    np.testing.assert_array_equal(asm.pending, [0])
    # The new episode starts from the reset observation.
    assert step1(asm, 100, 1.0) is None
    assert step1(asm, 101, 1.0) is None
    assert_transitions(step1(asm, 102, 1.0), [100], [1.75], [0.125], [103])


def test_truncation_flushes_all_windows_keeping_the_bootstrap():
    asm = NStepAssembler(1, N, G, box(1))
    for t in range(4):
        step1(asm, t, t + 1.0)
    out = step1(asm, 4, 5.0, truncated=True)
    assert_transitions(out, [2, 3, 4], [3 + 2 + 1.25, 4 + 2.5, 5], [0.125, 0.25, 0.5], [5, 5, 5])
    assert step1(asm, 5, 0.0, next_t=100) is None


def test_terminated_and_truncated_together_counts_as_termination():
    asm = NStepAssembler(1, N, G, box(1))
    assert_transitions(step1(asm, 0, 1.0, terminated=True, truncated=True), [0], [1], [0], [1])


@pytest.mark.parametrize("terminated, discount", [(True, [0.0, 0.0]), (False, [0.25, 0.5])])
def test_episode_shorter_than_n(terminated, discount):
    asm = NStepAssembler(1, N, G, box(1))
    assert step1(asm, 0, 1.0) is None
    out = step1(asm, 1, 2.0, terminated=terminated, truncated=not terminated)
    assert_transitions(out, [0, 1], [1 + 0.5 * 2, 2], discount, [2, 2])


def test_two_envs_out_of_phase():
    """env0 terminates after 2 steps while env1 runs on and truncates after 4."""
    asm = NStepAssembler(num_envs=2, n_step=N, gamma=G, observation_space=box(2))

    def push(t0, t1, r, term, trunc, n0, n1):
        obs = np.array([[0, t0], [1, t1]], np.float32)
        nxt = np.array([[0, n0], [1, n1]], np.float32)
        return asm.push(obs, np.array([t0, t1]), np.array(r, np.float64), np.array(term), np.array(trunc), nxt)

    assert push(0, 0, [1, 10], [0, 0], [0, 0], 1, 1) is None
    out = push(1, 1, [2, 20], [1, 0], [0, 0], 2, 2)  # env0 terminates
    np.testing.assert_array_equal(out["obs"], [[0, 0], [0, 1]])
    np.testing.assert_allclose(out["reward"], [2, 2])
    np.testing.assert_allclose(out["discount"], [0, 0])
    np.testing.assert_array_equal(out["next_obs"], [[0, 2], [0, 2]])

    out = push(2, 2, [0, 30], [0, 0], [0, 0], 100, 3)  # env0 autoresets; env1's first window fills
    np.testing.assert_array_equal(out["obs"], [[1, 0]])
    np.testing.assert_allclose(out["reward"], [10 + 10 + 7.5])
    np.testing.assert_allclose(out["discount"], [0.125])
    np.testing.assert_array_equal(out["next_obs"], [[1, 3]])

    out = push(100, 3, [1, 40], [0, 0], [0, 1], 101, 4)  # env1 truncates
    np.testing.assert_array_equal(out["obs"], [[1, 1], [1, 2], [1, 3]])
    np.testing.assert_allclose(out["reward"], [20 + 15 + 10, 30 + 20, 40])
    np.testing.assert_allclose(out["discount"], [0.125, 0.25, 0.5])
    np.testing.assert_array_equal(out["next_obs"], [[1, 4]] * 3)
    np.testing.assert_array_equal(out["action"], [1, 2, 3])

    assert push(101, 4, [1, 0], [0, 0], [0, 0], 102, 200) is None  # env1 autoresets
    out = push(102, 200, [1, 1], [0, 0], [0, 0], 103, 201)
    np.testing.assert_array_equal(out["obs"], [[0, 100]])
    np.testing.assert_allclose(out["reward"], [1.75])
    np.testing.assert_array_equal(out["next_obs"], [[0, 103]])
    np.testing.assert_array_equal(asm.pending, [2, 1])


def test_n_step_one_is_plain_one_step_transitions():
    asm = NStepAssembler(1, 1, G, box(1))
    assert_transitions(step1(asm, 0, 1.0), [0], [1], [0.5], [1])
    assert_transitions(step1(asm, 1, 2.0, terminated=True), [1], [2], [0], [2])
    assert step1(asm, 2, 0.0, next_t=100) is None


def test_flush_emits_pending_windows_as_truncated_and_reset_drops_them():
    asm = NStepAssembler(1, N, G, box(1))
    assert asm.flush() is None
    step1(asm, 0, 1.0)
    step1(asm, 1, 2.0)
    assert_transitions(asm.flush(), [0, 1], [2, 2], [0.25, 0.5], [2, 2])
    assert asm.flush() is None
    step1(asm, 2, 1.0)
    asm.reset()
    assert asm.flush() is None


# ---------------------------------------------------------------- against a reference


def reference_transitions(episodes, n, gamma):
    """Per-episode loop: each real step starts one window of min(n, steps left) rewards."""
    out = []
    for steps, end in episodes:
        terminated = end == "terminated"
        length = len(steps)
        for t in range(length):
            k = min(n, length - t)
            reward = sum(gamma**j * steps[t + j][2] for j in range(k))
            discount = 0.0 if terminated and t + k == length else gamma**k
            out.append((tuple(steps[t][0]), steps[t][1], reward, discount, tuple(steps[t + k - 1][3])))
    return sorted(out)


def as_rows(batches):
    rows = []
    for b in batches:
        for i in range(len(b["reward"])):
            rows.append(
                (tuple(b["obs"][i]), int(b["action"][i]), float(b["reward"][i]), float(b["discount"][i]),
                 tuple(b["next_obs"][i]))
            )
    return sorted(rows)


def assert_same_transitions(got, want):
    assert len(got) == len(want)
    for g_row, w_row in zip(got, want):
        assert g_row[0] == w_row[0] and g_row[1] == w_row[1] and g_row[4] == w_row[4]  # obs, action, next_obs
        assert g_row[2] == pytest.approx(w_row[2], rel=1e-5, abs=1e-5)  # reward
        assert g_row[3] == pytest.approx(w_row[3], rel=1e-6)  # discount


def run_and_record(env_step, num_envs, num_steps, obs, asm, act):
    """Drive any NEXT_STEP vector env; return emitted batches and the true per-env episodes."""
    batches, episodes = [], []
    current = [[] for _ in range(num_envs)]
    autoreset = np.zeros(num_envs, bool)
    for _ in range(num_steps):
        action = act()
        next_obs, reward, term, trunc = env_step(action)
        out = asm.push(obs, action, reward, term, trunc, next_obs)
        if out is not None:
            batches.append(out)
        for i in np.flatnonzero(~autoreset):
            current[i].append((obs[i].astype(np.float32), int(action[i]), float(reward[i]), next_obs[i].astype(np.float32)))
            if term[i] or trunc[i]:
                episodes.append((current[i], "terminated" if term[i] else "truncated"))
                current[i] = []
        autoreset = term | trunc
        obs = next_obs
    out = asm.flush()
    if out is not None:
        batches.append(out)
    episodes += [(steps, "unfinished") for steps in current if steps]
    return batches, episodes


def test_matches_reference_on_random_scripted_episodes():
    rng = np.random.default_rng(0)
    num_envs, n, gamma = 3, 4, 0.9
    counter = iter(range(10**9))
    state = {"obs": np.array([[next(counter)] for _ in range(num_envs)], np.float32), "reset": np.zeros(num_envs, bool)}

    def env_step(action):
        nxt = np.array([[next(counter)] for _ in range(num_envs)], np.float32)
        reward = rng.normal(size=num_envs)
        term = rng.random(num_envs) < 0.1
        trunc = rng.random(num_envs) < 0.1
        reward[state["reset"]] = 0.0
        term[state["reset"]] = trunc[state["reset"]] = False
        state["reset"] = term | trunc
        return nxt, reward, term, trunc

    asm = NStepAssembler(num_envs, n, gamma, box(1))
    batches, episodes = run_and_record(
        env_step, num_envs, 300, state["obs"], asm, lambda: rng.integers(0, 5, num_envs)
    )
    assert_same_transitions(as_rows(batches), reference_transitions(episodes, n, gamma))
    assert sum(len(b["reward"]) for b in batches) == sum(len(s) for s, _ in episodes)


def test_real_cartpole_vector_env():
    num_envs, n, gamma = 2, 3, 0.99
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync", max_episode_steps=15)
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)

    def env_step(action):
        nxt, reward, term, trunc, _ = env.step(action)
        return nxt, reward, term, trunc

    asm = NStepAssembler(num_envs, n, gamma, env.single_observation_space)
    batches, episodes = run_and_record(env_step, num_envs, 300, obs, asm, env.action_space.sample)
    env.close()

    ends = {end for _, end in episodes}
    assert {"terminated", "truncated"} <= ends
    real_steps = sum(len(steps) for steps, _ in episodes)
    assert sum(len(b["reward"]) for b in batches) == real_steps
    for b in batches:
        assert b["obs"].shape == b["next_obs"].shape == (len(b["reward"]), 4)
        assert b["action"].shape == b["discount"].shape == (len(b["reward"]),)
        k = np.round(np.log(np.where(b["discount"] > 0, b["discount"], 1)) / np.log(gamma)).astype(int)
        assert np.all((b["discount"] == 0) | ((k >= 1) & (k <= n)))
        np.testing.assert_allclose(b["discount"][b["discount"] > 0], gamma ** k[b["discount"] > 0], rtol=1e-6)
        # CartPole pays 1 per step: a window of k steps sums to (1 - g^k) / (1 - g).
        full = b["discount"] > 0
        np.testing.assert_allclose(b["reward"][full], (1 - gamma ** k[full]) / (1 - gamma), rtol=1e-5)
    assert_same_transitions(as_rows(batches), reference_transitions(episodes, n, gamma))


def test_uint8_frames_keep_their_dtype():
    """Atari-like frames are stored as uint8, not widened to float32."""
    asm = NStepAssembler(num_envs=1, n_step=1, gamma=0.9, observation_space=gym.spaces.Box(0, 255, (2, 2), np.uint8))
    frame = np.full((1, 2, 2), 200, np.uint8)
    out = asm.push(frame, np.array([1]), np.array([1.0]), np.array([False]), np.array([False]), frame + 1)
    assert out["obs"].dtype == np.uint8 and out["next_obs"].dtype == np.uint8
    assert out["next_obs"][0, 0, 0] == 201
