"""The actor's fast paths: Ape-X priorities from the Q values acting computed (no second forward pass) equal
the policy's own, on real vector envs; and many envs per actor stream end to end (sync and async vector envs,
CartPole and MinAtar), with the actor's per-section profile written on exit."""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from actorlearner import config as cfg
from actorlearner.actor.profile import SECTIONS
from actorlearner.algorithms import PRIORITY, make_spec
from actorlearner.algorithms.nstep import NStepAssembler
from actorlearner.envs import make_vector_env
from procs import start_actor, start_learner, status, stop, wait_until

NUM_ENVS = 8
STEPS = 300
EXPLORATION = 0.5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class BranchEnv(gym.Env):
    """Box(3) observations, MultiDiscrete([3, 2], start=[-1, 0]) actions (two action branches of different
    sizes, one not starting at 0); ends terminated with probability 0.15 a step, else truncated after 10."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.MultiDiscrete([3, 2], start=[-1, 0])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        move, push = (int(a) for a in action)
        self.steps += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        terminated = bool(self.np_random.random() < 0.15)
        return obs, float(move) + 0.5 * push, terminated, self.steps >= 10, {}


def cartpole() -> gym.vector.VectorEnv:
    """CartPole-v1 as the actor makes it: a random-ish policy terminates within ~20 steps, never truncates here."""
    return make_vector_env("CartPole-v1", NUM_ENVS)


def cartpole_time_limit() -> gym.vector.VectorEnv:
    """CartPole cut at 15 steps: episodes end truncated as well as terminated."""
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=15)] * NUM_ENVS)


def dict_walk() -> gym.vector.VectorEnv:
    """Dict observations (one field per leaf) and MultiDiscrete([3, 3], start=[-1, -1]) actions; truncated at 30."""
    return make_vector_env("custom_envs:dict_walk", NUM_ENVS)


def branches() -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([BranchEnv] * NUM_ENVS)


def concat(blocks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([block[key] for block in blocks]) for key in blocks[0]}


def assert_same_transitions(got: dict[str, np.ndarray] | None, want: dict[str, np.ndarray] | None, what: str):
    """Same fields, dtypes, order and values (PRIORITY aside)."""
    if want is None:
        assert got is None, f"{what}: expected nothing, got {got and len(got['reward'])} transitions"
        return
    assert got is not None, f"{what}: expected {len(want['reward'])} transitions, got none"
    got = {key: value for key, value in got.items() if key != PRIORITY}
    assert set(got) == set(want), what
    for key in want:
        assert got[key].dtype == want[key].dtype, f"{what}: {key}"
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{what}: {key}")


def small_dqn(envs: gym.vector.VectorEnv):
    """A seeded DQN policy with small hidden layers for ``envs``, and its assembler."""
    spec = make_spec("dqn", envs.single_observation_space, envs.single_action_space, {"hidden_sizes": [32, 32]})
    policy = spec.make_policy(seed=0)
    return policy, spec.make_assembler(NUM_ENVS, policy)


def policy_priorities(policy, block: dict[str, np.ndarray]) -> np.ndarray:
    """What the actor computes with a second forward pass: the policy's initial priorities of the block's fields."""
    tensors = {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in block.items() if key != PRIORITY}
    return policy.initial_priorities(tensors).numpy()


@pytest.mark.parametrize("make_envs, must_terminate, expect_truncations", [
    (cartpole, True, False),
    (cartpole_time_limit, True, True),
    (dict_walk, False, True),  # reaching the goal (terminated) is rare for a random walk: not required
    (branches, True, True),
], ids=lambda value: getattr(value, "__name__", None))
def test_priorities_from_acting_equal_the_policys_and_the_transitions_are_the_plain_ones(
        make_envs, must_terminate, expect_truncations):
    envs = make_envs()
    try:
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        spec = make_spec("dqn", obs_space, act_space, {"hidden_sizes": [32, 32]})
        policy = spec.make_policy(seed=0)
        acted = spec.make_assembler(NUM_ENVS, policy)
        plain = NStepAssembler(NUM_ENVS, spec.config.n_step, spec.config.gamma, obs_space, spec.branches.shape, np.int64)
        acted_out, plain_out = [], []
        terminations = truncations = 0
        obs, _ = envs.reset(seed=0)
        for _ in range(STEPS):
            actions, q = policy.act_values(obs, EXPLORATION)
            assert q.shape == (NUM_ENVS, len(spec.branches.sizes), max(spec.branches.sizes))
            next_obs, rewards, terminated, truncated, _ = envs.step(actions)
            terminations += int(terminated.sum())
            truncations += int((truncated & ~terminated).sum())
            acted_out.append(acted.push(obs, actions, rewards, terminated, truncated, next_obs, acted=q))
            plain_out.append(plain.push(obs, actions, rewards, terminated, truncated, next_obs))
            obs = next_obs
        acted_flush, plain_flush = acted.flush(), plain.flush()
    finally:
        envs.close()

    # The episodes this run covers end as the case is meant to (a termination cuts the bootstrap; a truncation
    # keeps it, valued at the final observation the policy acts on at the autoreset step).
    if must_terminate:
        assert terminations > 0
    assert (truncations > 0) == expect_truncations
    pushed = concat([block for block in plain_out if block is not None])
    assert len(pushed["reward"]) > STEPS * NUM_ENVS * 0.7  # nearly one transition per real env step
    assert (pushed["discount"] == 0).any() == (terminations > 0)
    # A truncation emits the windows shorter than n steps with their bootstrap: discount gamma**k, k < n.
    short = pushed["discount"] > spec.config.gamma ** spec.config.n_step + 1e-6
    assert short.any() == expect_truncations

    # Delayed by one push, otherwise the same: what push t + 1 gives with Q values is what push t gives without;
    # the flush gives the last push's transitions then everything pending.
    assert acted_out[0] is None
    for t in range(1, STEPS):
        assert_same_transitions(acted_out[t], plain_out[t - 1], f"push {t}")
    last = [block for block in (plain_out[-1], plain_flush) if block is not None]
    assert_same_transitions(acted_flush, concat(last) if last else None, "flush")

    # Every pushed-out transition is valued, and as the policy values it with a second forward pass.
    valued = [block for block in acted_out if block is not None]
    assert sum(len(block[PRIORITY]) for block in valued) > STEPS * NUM_ENVS * 0.7
    for block in valued:
        assert block[PRIORITY].dtype == np.float32 and np.isfinite(block[PRIORITY]).all()
        np.testing.assert_allclose(block[PRIORITY], policy_priorities(policy, block), rtol=1e-5, atol=1e-6)
        assert (block[PRIORITY] > 0).all()
    # The flush cannot value the last observations: its priorities are NaN, left to the policy.
    assert acted_flush is not None and len(acted_flush[PRIORITY]) > 0
    assert np.isnan(acted_flush[PRIORITY]).all()


@pytest.mark.parametrize("first", [True, False], ids=["acted-first", "plain-first"])
def test_pushing_with_and_without_q_values_is_a_value_error(first):
    envs = cartpole()
    try:
        policy, asm = small_dqn(envs)
        obs, _ = envs.reset(seed=0)
        steps = []
        for _ in range(2):
            actions, q = policy.act_values(obs, EXPLORATION)
            next_obs, rewards, terminated, truncated, _ = envs.step(actions)
            steps.append(((obs, actions, rewards, terminated, truncated, next_obs), q))
            obs = next_obs
    finally:
        envs.close()
    (pushed, q), (again, q_again) = steps
    if first:
        asm.push(*pushed, acted=q)
        with pytest.raises(ValueError):
            asm.push(*again)
        asm.push(*again, acted=q_again)  # still usable the consistent way
    else:
        asm.push(*pushed)
        with pytest.raises(ValueError):
            asm.push(*again, acted=q_again)
        asm.push(*again)


def test_after_reset_every_transition_pushed_out_is_valued_as_the_policy_values_it():
    """reset() is for an explicit env.reset(): whatever comes out afterwards must still carry the priority the
    policy gives it (or not come out at all)."""
    envs = cartpole()
    try:
        policy, asm = small_dqn(envs)
        obs, _ = envs.reset(seed=0)
        out = []
        for t in range(12):
            if t == 6:
                obs, _ = envs.reset(seed=1)
                asm.reset()
            actions, q = policy.act_values(obs, EXPLORATION)
            next_obs, rewards, terminated, truncated, _ = envs.step(actions)
            out.append(asm.push(obs, actions, rewards, terminated, truncated, next_obs, acted=q))
            obs = next_obs
    finally:
        envs.close()
    for t, block in enumerate(out):
        if block is not None:
            np.testing.assert_allclose(block[PRIORITY], policy_priorities(policy, block), rtol=1e-5, atol=1e-6,
                                       err_msg=f"push {t}")


ACTING_SPACES = {
    "box": (spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(4)),
    "image and discrete": (spaces.Dict({"frame": spaces.Box(0, 255, (10, 10, 2), np.uint8), "n": spaces.Discrete(3)}),
                           spaces.Discrete(5, start=-2)),
    "masked": (spaces.Dict({"obs": spaces.Box(-1.0, 1.0, (2,), np.float32), "action_mask": spaces.MultiBinary(3)}),
               spaces.Discrete(3)),
    "branches": (spaces.Box(-1.0, 1.0, (2, 2), np.float32), spaces.MultiDiscrete([3, 2], start=[-1, 0])),
}


@pytest.mark.parametrize("name", ACTING_SPACES)
def test_the_acting_function_computes_exactly_the_networks_forward_and_follows_loaded_weights(name):
    observation_space, action_space = ACTING_SPACES[name]
    observation_space.seed(0)
    spec = make_spec("dqn", observation_space, action_space, {"hidden_sizes": [16, 8]})
    policy, other = spec.make_policy(seed=1), spec.make_policy(seed=2)
    obs = policy._split(gym.vector.utils.concatenate(
        observation_space, [observation_space.sample() for _ in range(5)],
        gym.vector.utils.create_empty_array(observation_space, 5)))
    leaves = {key: torch.as_tensor(array) for key, array in obs.items()}
    with torch.no_grad():
        before = policy.online(leaves)
        assert torch.equal(policy.online.function()(leaves), before) and torch.equal(policy._q(leaves), before)
        policy.load_policy_state_dict(other.policy_state_dict())  # the function bound earlier follows it
        after = policy.online(leaves)
        assert torch.equal(policy._q(leaves), after) and not torch.equal(after, before)


def test_a_later_num_envs_flag_wins():
    """start_actor passes --num-envs 2 before the test's own flags: the actor's parser keeps the last."""
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cfg.ActorConfig)
    args = parser.parse_args(["--learner", "127.0.0.1:1", "--num-envs", "2", "--env", "CartPole-v1",
                              "--num-envs", "64"])
    assert cfg.build(cfg.ActorConfig, args, {}).num_envs == 64


# ---------------------------------------------------------------- many envs, end to end

VECTOR_STEPS = 200
ACTOR_BATCH, MAX_UNACKED, N_STEP = 256, 8, 3  # the learner's defaults, passed as flags for the bound below


def status_if(port: int, predicate):
    """The learner's status when ``predicate`` holds of it, else None (for wait_until)."""
    current = status(port)
    return current if predicate(current) else None


@pytest.mark.parametrize("env, mode, num_envs", [
    ("CartPole-v1", "sync", 64),
    ("MinAtar/Breakout-v1", "sync", 64),
])
def test_many_envs_stream_end_to_end_and_the_actor_writes_its_profile(tmp_path, env, mode, num_envs):
    """Streaming only (training never starts): the learner counts the actor's env steps and inserts its
    transitions; on SIGTERM the actor exits 0 and writes where its loop's time went."""
    profile_file = tmp_path / "profile.json"
    learner, port = start_learner("--env", env, "--min-replay-size", "1000000000", "--replay-capacity", "20000",
                                  "--eval-every", "0", "--dqn-hidden-sizes", "32,32", "--dqn-n-step", str(N_STEP),
                                  "--actor-batch-size", str(ACTOR_BATCH), "--max-unacked", str(MAX_UNACKED))
    actor = None
    try:
        actor = start_actor(port, "many", "--env", env, "--num-envs", str(num_envs), "--vector-mode", mode,
                            "--profile-file", str(profile_file))
        target = num_envs * VECTOR_STEPS
        seen = wait_until(lambda: status_if(port, lambda s: s.env_steps >= target and s.inserted > 0), 120,
                          f"{target} env steps of {env} ({mode}) at the learner")
        assert seen.buffer_size > 0 and seen.updates == 0
        later = wait_until(lambda: status_if(port, lambda s: s.env_steps > seen.env_steps), 60, "env steps still rising")
        assert later.inserted >= seen.inserted > 0
        mine = {a.actor_id: a for a in later.actors}["many"]
        assert mine.inserted > 0
        assert actor.poll() is None, "the actor exited early"
        actor_code, = stop(actor)
        assert actor_code == 0
        profile = json.loads(profile_file.read_text())
        assert profile["env_steps"] >= later.env_steps  # the learner counts what the actor reported
        # Every real env step starts exactly one transition: the learner holds no more than the actor stepped, and
        # no fewer than that minus what the actor still held at exit (its partly filled batch, a batch the stop
        # cut short, the n-step windows and a window of unacked batches if the flush at exit timed out).
        stored = {a.actor_id: a for a in status(port).actors}["many"].transitions
        held = (MAX_UNACKED + 2) * ACTOR_BATCH + num_envs * N_STEP
        assert profile["env_steps"] - held <= stored <= profile["env_steps"]
        assert set(profile["seconds"]) == set(SECTIONS)
        assert all(seconds >= 0 for seconds in profile["seconds"].values()), profile["seconds"]
        assert profile["seconds"]["act"] > 0 and profile["seconds"]["env"] > 0
        assert set(profile["us_per_step"]) == set(SECTIONS) | {"total"}
        assert profile["us_per_step"]["total"] > 0
    finally:
        codes = stop(*(p for p in (actor, learner) if p is not None))
    assert codes[-1] == 0
