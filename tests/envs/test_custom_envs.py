"""The custom test environments are valid gymnasium envs, and GoalImageEnv's baselines are as documented."""

import pytest
from gymnasium.utils.env_checker import check_env

import custom_envs


def test_goal_image_passes_gymnasium_env_checker():
    check_env(custom_envs.goal_image(), skip_render_check=True)


def test_goal_image_baselines_match_the_documented_figures():
    random_return, optimal_return = custom_envs.goal_image_baselines(1000, seed=0)
    assert random_return == pytest.approx(custom_envs.GOAL_IMAGE_RANDOM_RETURN, abs=5e-4)
    assert optimal_return == pytest.approx(custom_envs.GOAL_IMAGE_OPTIMAL_RETURN, abs=5e-4)
    assert random_return < 0.5 * optimal_return


def test_goal_image_goal_is_only_in_the_image():
    env = custom_envs.goal_image()
    obs, info = env.reset(seed=7)
    assert list(obs) == ["image", "position", "noise_discrete", "noise_bits", "noise_tuple"]
    assert (obs["image"] == 255).sum() == 1 and (obs["image"] == 128).sum() == 1
    for _ in range(info["distance"]):
        obs, reward, terminated, truncated, _ = env.step(custom_envs.goal_image_shortest_path(obs))
    assert terminated and not truncated and reward == 1.0
