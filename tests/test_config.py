"""Configs: one source for flags, env vars and TOML; the README's tables stay generated from it."""

import argparse
from pathlib import Path

import pytest

from actorlearner import config as cfg
from actorlearner.docs import render


def parse(cls, argv):
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cls)
    return parser.parse_args(argv)


def test_flags_beat_env_vars_beat_toml_beat_defaults(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('actors = 5\nseed = 3\nenv = "Acrobot-v1"\n[dqn]\nlr = 0.5\nhidden_sizes = [8, 8]\n')
    args = parse(cfg.RunConfig, ["--config", str(toml), "--actors", "7"])
    run = cfg.build(cfg.RunConfig, args, {"ACTORLEARNER_SEED": "11"})
    assert run.actors == 7                     # flag
    assert run.learner.seed == 11              # env var over TOML
    assert run.learner.env == "Acrobot-v1"     # TOML (flattened group reads the top table)
    assert run.learner.dqn.lr == 0.5 and run.learner.dqn.hidden_sizes == (8, 8)
    assert run.max_seconds == cfg.RunConfig().max_seconds  # default


def test_every_kind_of_value_parses():
    args = parse(cfg.LearnerConfig, ["--checkpoint-replay", "false", "--dqn-hidden-sizes", "4,5,6",
                                     "--alpha", "0.7", "--port", "0"])
    learner = cfg.build(cfg.LearnerConfig, args, {"ACTORLEARNER_DQN_DUELING": "no"})
    assert learner.checkpoint_replay is False and learner.dqn.hidden_sizes == (4, 5, 6)
    assert learner.alpha == 0.7 and learner.port == 0 and learner.dqn.dueling is False


def test_bad_values_name_their_source():
    with pytest.raises(ValueError, match="ACTORLEARNER_PORT"):
        cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, []), {"ACTORLEARNER_PORT": "eighty"})
    with pytest.raises(ValueError, match="--checkpoint-replay"):
        cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, ["--checkpoint-replay", "maybe"]), {})


def test_every_option_has_help_and_a_unique_flag():
    for cls in (cfg.LearnerConfig, cfg.ActorConfig, cfg.RunConfig):
        opts = cfg.options(cls)
        assert all(o.help for o in opts), [o.flag for o in opts if not o.help]
        assert len({o.flag for o in opts}) == len(opts)


def test_readme_option_tables_are_current():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert render(readme) == readme, "README option tables are stale: run `python -m actorlearner.docs`"
