"""After training: ``run``'s run directory (checkpoints, logs, curve.png) and ``actorlearner eval``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from actorlearner import config as cfg
from actorlearner.checkpoint.parts import CheckpointError
from actorlearner.config import LearnerConfig
from actorlearner.config.presets import PRESETS, describe
from actorlearner.curve import target_reached
from actorlearner.envs import make_env
from actorlearner.learner.learner import Learner
from actorlearner.trained import evaluate_trained, load_trained
from procs import CHILD_ENV, FAST_LEARNER, run_command


def eval_json(*args: str) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "actorlearner", "eval", *args], timeout=120, env=CHILD_ENV)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """A learner's checkpoint (under a run directory's ``checkpoints/``) and the learner that wrote it."""
    run_dir = tmp_path_factory.mktemp("run")
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, checkpoint_dir=str(run_dir / "checkpoints")))
    learner.checkpoint()
    return run_dir, learner


def test_the_loaded_policy_acts_as_the_learner_s_own(checkpointed):
    run_dir, learner = checkpointed
    trained = load_trained(run_dir)
    assert (trained.env, trained.algorithm) == ("CartPole-v1", "dqn")
    env = make_env("CartPole-v1")
    obs = np.stack([env.observation_space.sample() for _ in range(64)])
    env.close()
    own = learner.trainer.spec.make_policy()  # acting with the learner's own weights
    own.load_policy_state_dict(learner.trainer.policy_state_dict())
    np.testing.assert_array_equal(trained.policy.act(obs, 0.0), own.act(obs, 0.0))


def test_eval_prints_one_json_line_with_the_returns_of_the_episodes_it_played(checkpointed):
    run_dir, _ = checkpointed
    done = eval_json("--checkpoint", str(run_dir), "--episodes", "6", "--envs", "3", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {"episodes", "mean_return", "std_return", "min_return", "max_return"}
    expected = evaluate_trained(load_trained(run_dir / "checkpoints"), 6, 3, 0)  # greedy and seeded: the same
    assert result == {"episodes": 6, "mean_return": expected.mean, "std_return": expected.std,
                      "min_return": expected.min, "max_return": expected.max}
    assert result["min_return"] <= result["mean_return"] <= result["max_return"]


def test_eval_refuses_what_is_not_a_usable_checkpoint(tmp_path):
    done = eval_json("--checkpoint", str(tmp_path / "missing"))
    assert done.returncode == 1 and "does not exist" in done.stderr
    done = eval_json("--checkpoint", str(tmp_path))
    assert done.returncode == 1 and "no usable checkpoint" in done.stderr
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        load_trained(tmp_path)


def test_run_keeps_checkpoints_logs_and_a_learning_curve_in_its_run_directory(tmp_path):
    """The run ends at its second evaluation (every CartPole return passes 0; --target-holds 2), however busy
    the machine."""
    run_dir = tmp_path / "run"
    done = run_command([sys.executable, "-m", "actorlearner", "run", "--port", "0", "--vector-mode", "sync",
                        *FAST_LEARNER, "--actors", "1",
                        "--num-envs", "2", "--max-seconds", "240", "--target-return", "0", "--target-holds", "2",
                        "--eval-every", "3", "--eval-episodes", "2", "--eval-envs", "2", "--run-dir", str(run_dir)],
                       timeout=360, env=CHILD_ENV)  # past --max-seconds
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["run_dir"] == str(run_dir) and result["curve"] == str(run_dir / "curve.png"), result
    assert result["solved"] and result["solved_at"]["seconds"] > result["first_hit"]["seconds"] > 0, result
    assert result["solved_at"]["env_steps"] >= result["first_hit"]["env_steps"] > 0, result
    assert f"learning curve: {run_dir / 'curve.png'}" in done.stderr
    # The picture: both panels drawn, with the episode-return line (blue) and the eval line (orange).
    image = np.asarray(Image.open(run_dir / "curve.png").convert("RGB"))
    assert image.shape == (450, 1100, 3)
    pixels = {tuple(p) for p in image.reshape(-1, 3)[::7]}
    assert (31, 119, 180) in pixels and (255, 127, 14) in pixels, "a curve is missing from the PNG"
    assert list((run_dir / "checkpoints").glob("ckpt-*/manifest.json")), "no checkpoint in the run directory"
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert "hyperparameters/text_summary" in events.Tags()["tensors"]
    text = events.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| batch_size | 64 |" in text and "| dqn.hidden_sizes | (32, 32) |" in text
    assert load_trained(run_dir).env == "CartPole-v1"
    # CartPole's preset, but for what the command line set (--eval-every): in the log and the run's settings
    preset = {name: value for name, value in PRESETS["dqn"]["CartPole-v1"].items() if name != "eval-every"}
    settings = json.loads((run_dir / "settings.json").read_text())
    assert settings["preset_applied"] == preset and settings["dqn.lr"] == preset["dqn-lr"], settings
    assert settings["eval_every"] == 3.0 and settings["batch_size"] == 64
    assert f"preset CartPole-v1 for dqn: {describe(preset)} (" in done.stderr


def test_a_held_solve_ignores_a_single_lucky_evaluation():
    """--target-holds 2: the first hit is reported, but only two evaluations in a row at the target solve."""
    evaluations = [(5.0, 1_000, 120.0), (10.0, 2_000, 480.0), (15.0, 3_000, 310.0), (20.0, 4_000, 475.0),
                   (25.0, 5_000, 500.0), (30.0, 6_000, 500.0)]
    assert target_reached(evaluations, 475.0, holds=2) == (evaluations[1], evaluations[4])
    assert target_reached(evaluations, 475.0) == (evaluations[1], evaluations[1])
    assert target_reached(evaluations[:4], 475.0, holds=2) == (evaluations[1], None)
    assert target_reached(evaluations, 501.0, holds=2) == (None, None)


def test_no_plot_turns_the_curve_off():
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cfg.RunConfig)
    assert cfg.build(cfg.RunConfig, parser.parse_args(["--no-plot"])).plot is False
    assert cfg.build(cfg.RunConfig, parser.parse_args([])).plot is True


def test_eval_video_records_the_first_episodes_it_plays_as_playable_mp4s(checkpointed, tmp_path):
    run_dir, _ = checkpointed
    done = eval_json("--checkpoint", str(run_dir), "--episodes", "4", "--envs", "2", "--json",
                     "--video", str(tmp_path / "videos"), "--video-episodes", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    videos = result.pop("videos")
    # The first 3 episodes in the reported order: env 0's two, then env 1's first.
    assert videos == [str(tmp_path / "videos" / name)
                      for name in ("env-0-episode-0.mp4", "env-0-episode-1.mp4", "env-1-episode-0.mp4")]
    expected = evaluate_trained(load_trained(run_dir), 4, 2, 0)  # the same episodes, played without a recorder
    assert result == {"episodes": 4, "mean_return": expected.mean, "std_return": expected.std,
                      "min_return": expected.min, "max_return": expected.max}
    for path, length in zip(videos, expected.lengths[:3]):
        frames = imageio_ffmpeg.read_frames(path)
        assert next(frames)["size"] == (600, 400), path  # CartPole's render size
        images = [np.frombuffer(frame, np.uint8).reshape(400, 600, 3) for frame in frames]
        # The recorder keeps the reset frame and one a step; moviepy's writer may drop the last one
        # (it rounds the clip's duration), as seen for a 472-step episode that decoded to 472 frames.
        assert length <= len(images) <= length + 1, path
        assert all(image.var() > 0 for image in images), f"{path} has a blank frame"


def test_eval_video_refuses_an_env_that_cannot_render_frames_before_playing(tmp_path):
    run_dir = tmp_path / "run"
    Learner(LearnerConfig(env="custom_envs:memory_cue", eval_every=0, checkpoint_dir=str(run_dir))).checkpoint()
    done = eval_json("--checkpoint", str(run_dir), "--video", str(tmp_path / "videos"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "cannot record videos: custom_envs:memory_cue cannot render 'rgb_array': its render modes are none")
    assert not (tmp_path / "videos").exists()


def test_make_env_passes_a_render_mode_on_or_says_why_it_cannot():
    env = make_env("CartPole-v1", render_mode="rgb_array")
    env.reset(seed=0)
    assert env.render().shape == (400, 600, 3)
    env.close()
    with pytest.raises(ValueError, match=r"^custom_envs:frozen_lake was made with render_mode=None, not 'rgb_array' "
                                         r"\(its render modes are 'human', 'ansi', 'rgb_array'\)"):
        make_env("custom_envs:frozen_lake", render_mode="rgb_array")
    with pytest.raises(ValueError, match="^grpc://127.0.0.1:1 cannot render 'rgb_array': its render modes are none$"):
        make_env("grpc://127.0.0.1:1", render_mode="rgb_array")
