"""Per-task presets: applied by env id to the options the user left unset, recorded, overridden by any flag,
env var or TOML value, turned off or borrowed with --preset; every shipped preset names real options."""

from __future__ import annotations

import argparse
import logging

import pytest

from actorlearner import config as cfg
from actorlearner.algorithms import resolve
from actorlearner.cli.learner import start_learner
from actorlearner.config import presets

DQN = resolve("dqn")
TUNED = {"samples-per-insert": 12.0, "eval-every": 4.0, "dqn-n-step": 7, "dqn-lr": 0.002, "dqn-hidden-sizes": (64, 32)}


@pytest.fixture
def tuned(monkeypatch):
    """A test preset for dqn on CartPole-v1, in place of the shipped table."""
    monkeypatch.setattr(presets, "PRESETS", {"dqn": {"CartPole-v1": dict(TUNED)}})


def build(cls, argv, environ=None):
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cls, DQN)
    return cfg.build(cls, parser.parse_args(argv), environ or {}, DQN)


def test_the_env_ids_preset_fills_every_option_left_unset_and_says_so(tuned):
    learner = build(cfg.LearnerConfig, ["--env", "CartPole-v1"])
    assert (learner.samples_per_insert, learner.eval_every) == (12.0, 4.0)
    assert (learner.algorithm_config.n_step, learner.algorithm_config.lr) == (7, 0.002)
    assert learner.algorithm_config.hidden_sizes == (64, 32)
    assert learner.preset_applied == TUNED
    run = build(cfg.RunConfig, ["--env", "CartPole-v1"])  # run's flattened learner options alike
    assert run.learner.samples_per_insert == 12.0 and run.learner.preset_applied == TUNED


def test_a_flag_an_env_var_or_a_toml_value_beats_the_preset(tuned, tmp_path):
    toml = tmp_path / "settings.toml"
    toml.write_text('env = "CartPole-v1"\neval_every = 9.0\n[dqn]\nlr = 0.0001\n')
    learner = build(cfg.LearnerConfig, ["--config", str(toml), "--dqn-n-step", "2"],
                    {"ACTORLEARNER_SAMPLES_PER_INSERT": "3"})
    assert (learner.samples_per_insert, learner.eval_every) == (3.0, 9.0)  # env var, TOML
    assert (learner.algorithm_config.n_step, learner.algorithm_config.lr) == (2, 0.0001)  # flag, TOML table
    assert learner.algorithm_config.hidden_sizes == (64, 32)  # the one left unset
    assert learner.preset_applied == {"dqn-hidden-sizes": (64, 32)}


def test_preset_none_turns_it_off_and_an_env_id_borrows_that_envs(tuned):
    plain = build(cfg.LearnerConfig, ["--env", "CartPole-v1", "--preset", "none"])
    assert plain.preset_applied == {} and plain.samples_per_insert == cfg.LearnerConfig.samples_per_insert
    assert plain.algorithm_config.n_step == DQN.config_class().n_step
    borrowed = build(cfg.LearnerConfig, ["--env", "my_envs:balance", "--preset", "CartPole-v1"])
    assert borrowed.preset_applied == TUNED and borrowed.algorithm_config.n_step == 7
    assert build(cfg.LearnerConfig, ["--env", "my_envs:balance"]).preset_applied == {}  # none of its own
    with pytest.raises(ValueError, match="dqn has no preset for it; use auto, none or one of: CartPole-v1"):
        build(cfg.LearnerConfig, ["--preset", "Pong"])


def test_a_preset_naming_no_option_is_refused(monkeypatch):
    monkeypatch.setattr(presets, "PRESETS", {"dqn": {"CartPole-v1": {"dqn-n-stpe": 5}}})
    with pytest.raises(ValueError, match="names no learner or dqn option: dqn-n-stpe"):
        build(cfg.LearnerConfig, ["--env", "CartPole-v1"])


@pytest.mark.parametrize("algorithm, env", [(a, e) for a, table in presets.PRESETS.items() for e in table])
def test_every_shipped_preset_builds_and_is_applied_whole(algorithm, env):
    resolved = resolve(algorithm)
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cfg.RunConfig, resolved)
    run = cfg.build(cfg.RunConfig, parser.parse_args(["--algorithm", algorithm, "--env", env]), {}, resolved)
    assert run.learner.preset_applied == presets.PRESETS[algorithm][env]


def test_the_learner_names_its_preset_in_its_first_lines(tuned, caplog):
    config = build(cfg.LearnerConfig, ["--env", "CartPole-v1", "--dqn-n-step", "3", "--port", "0"])
    with caplog.at_level(logging.INFO, logger="actorlearner"):
        learner = start_learner(config)
    try:
        line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("preset "))
    finally:
        learner.stop()
    assert line.startswith("preset CartPole-v1 for dqn: samples-per-insert=12.0 eval-every=4.0 dqn-lr=0.002 "
                           "dqn-hidden-sizes=64,32 (")
    assert "--preset none" in line and "n-step" not in line  # the flag's value is the user's, not the preset's


def test_every_atari_game_takes_the_ale_family_preset_and_a_minatar_game_its_own():
    pong = build(cfg.LearnerConfig, ["--env", "ALE/Pong-v5"])
    breakout = build(cfg.LearnerConfig, ["--env", "ALE/Breakout-v5?episodic_life=true"])
    assert pong.preset_applied == breakout.preset_applied == presets.PRESETS["dqn"]["ALE/*"]
    assert (pong.eval_every, pong.eval_episodes) == (60.0, 5)
    for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"):
        minatar = build(cfg.LearnerConfig, ["--env", f"MinAtar/{game}-v1"])
        assert minatar.algorithm_config.hidden_sizes == (128,), game
    assert build(cfg.LearnerConfig, ["--env", "Other/Game-v0"]).preset_applied == {}
