"""Configs: one source for flags, env vars and TOML; the algorithm's own options prefixed with its name;
the README's tables and code map stay generated from the code."""

import argparse
import dataclasses
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from actorlearner import config as cfg
from actorlearner.algorithms.dqn import DQN, DQNConfig
from actorlearner.docs import SECTIONS, UNDOCUMENTED, code_map, render, summary


def parse(cls, argv, algorithm=None):
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cls, algorithm)
    return parser.parse_args(argv)


@dataclass
class TabularConfig:
    """A user algorithm's config."""

    step_size: float = 0.1
    """Tabular learning rate."""
    bins: tuple[int, ...] = (10, 10)
    """Discretization bins per observation dimension."""
    optimistic: bool = False
    """Start every value at the largest return."""


class Tabular:
    """What the config needs of a user algorithm: its name and its config dataclass."""

    name: ClassVar[str] = "tabular"
    config_class: ClassVar[type] = TabularConfig


def test_flags_beat_env_vars_beat_toml_beat_defaults(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('actors = 5\nseed = 3\nenv = "Acrobot-v1"\n[dqn]\nlr = 0.5\nhidden_sizes = [8, 8]\ngamma = 0.9\n')
    args = parse(cfg.RunConfig, ["--config", str(toml), "--actors", "7", "--dqn-gamma", "0.8"], DQN)
    run = cfg.build(cfg.RunConfig, args, {"ACTORLEARNER_SEED": "11", "ACTORLEARNER_DQN_LR": "0.25"}, DQN)
    assert run.actors == 7                     # flag
    assert run.learner.seed == 11              # env var over TOML
    assert run.learner.env == "Acrobot-v1"     # TOML (flattened group reads the top table)
    dqn = run.learner.algorithm_config
    assert isinstance(dqn, DQNConfig)
    assert dqn.gamma == 0.8                    # algorithm flag over TOML
    assert dqn.lr == 0.25                      # algorithm env var over TOML
    assert dqn.hidden_sizes == (8, 8)          # the algorithm's TOML table
    assert dqn.n_step == DQNConfig().n_step    # algorithm default
    assert run.max_seconds == cfg.RunConfig().max_seconds  # default


def test_every_kind_of_value_parses():
    args = parse(cfg.LearnerConfig, ["--checkpoint-replay", "false", "--dqn-hidden-sizes", "4,5,6",
                                     "--alpha", "0.7", "--port", "0", "--dqn-channel-order", "chw"], DQN)
    learner = cfg.build(cfg.LearnerConfig, args, {"ACTORLEARNER_DQN_DUELING": "no"}, DQN)
    dqn = learner.algorithm_config
    assert learner.checkpoint_replay is False and dqn.hidden_sizes == (4, 5, 6)
    assert learner.alpha == 0.7 and learner.port == 0 and dqn.dueling is False and dqn.channel_order == "chw"


def test_algorithm_options_from_flag_env_and_toml_land_in_algorithm_config(tmp_path):
    toml = tmp_path / "learner.toml"
    toml.write_text('algorithm = "dqn"\n[dqn]\nepsilon_base = 0.3\ntarget_update_period = 100\n')
    # --preset none: the default env's preset (its own tests are in test_presets.py) sets no option here
    argv = ["--config", str(toml), "--algorithm", "dqn", "--dqn-lr", "0.01", "--preset", "none"]
    environ = {"ACTORLEARNER_DQN_HIDDEN_SIZES": "16,16"}
    learner = cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, argv, DQN), environ, DQN)
    assert learner.algorithm == "dqn"
    assert learner.algorithm_config == DQNConfig(lr=0.01, hidden_sizes=(16, 16), epsilon_base=0.3,
                                                 target_update_period=100)
    run = cfg.build(cfg.RunConfig, parse(cfg.RunConfig, argv, DQN), environ, DQN)
    assert run.learner.algorithm == "dqn" and run.learner.algorithm_config == learner.algorithm_config


def test_algorithm_options_exist_only_with_an_algorithm_and_a_learner():
    with pytest.raises(SystemExit):  # argparse: unrecognized argument
        parse(cfg.LearnerConfig, ["--dqn-lr", "0.01"])
    assert cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, []), {}).algorithm_config is None
    with pytest.raises(SystemExit):  # an actor has no learner config, so no algorithm options
        parse(cfg.ActorConfig, ["--dqn-lr", "0.01"], DQN)
    assert cfg.build(cfg.ActorConfig, parse(cfg.ActorConfig, [], DQN), {}, DQN) == cfg.ActorConfig()
    # Defaults only (no preset: the default env, CartPole-v1, has one): still a full config of the algorithm.
    plain = parse(cfg.LearnerConfig, ["--preset", "none"], DQN)
    assert cfg.build(cfg.LearnerConfig, plain, {}, DQN).algorithm_config == DQNConfig()


def test_a_user_algorithm_gets_options_prefixed_with_its_name(tmp_path):
    flags = {opt.flag for opt in cfg.options(Tabular.config_class, f"{Tabular.name}-")}
    assert flags == {"--tabular-step-size", "--tabular-bins", "--tabular-optimistic"}
    toml = tmp_path / "t.toml"
    toml.write_text("[tabular]\nbins = [4, 5, 6]\n[dqn]\nlr = 9.0\n")
    args = parse(cfg.RunConfig, ["--config", str(toml), "--tabular-step-size", "0.5"], Tabular)
    run = cfg.build(cfg.RunConfig, args, {"ACTORLEARNER_TABULAR_OPTIMISTIC": "yes"}, Tabular)
    assert run.learner.algorithm_config == TabularConfig(step_size=0.5, bins=(4, 5, 6), optimistic=True)
    with pytest.raises(SystemExit):  # DQN's options are not there for another algorithm
        parse(cfg.LearnerConfig, ["--dqn-lr", "0.01"], Tabular)


class Picky(Tabular):
    """A user algorithm with learner defaults of its own."""

    learner_defaults: ClassVar[dict] = {"batch_size": 256, "samples_per_insert": 64.0}


def test_an_algorithms_learner_defaults_replace_the_learners_and_lose_to_any_user_value(tmp_path, capsys):
    learner = cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, [], Picky), {}, Picky)
    assert (learner.batch_size, learner.samples_per_insert) == (256, 64.0)
    assert learner.min_replay_size == cfg.LearnerConfig.min_replay_size  # not among its defaults
    toml = tmp_path / "t.toml"
    toml.write_text("samples_per_insert = 32.0\n")
    run = cfg.build(cfg.RunConfig, parse(cfg.RunConfig, ["--config", str(toml), "--batch-size", "16"], Picky),
                    {}, Picky)
    assert (run.learner.batch_size, run.learner.samples_per_insert) == (16, 32.0)  # flag, TOML
    learner = cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, [], Picky), {"ACTORLEARNER_BATCH_SIZE": "8"},
                        Picky)
    assert learner.batch_size == 8  # env var
    with pytest.raises(SystemExit):
        parse(cfg.LearnerConfig, ["--help"], Picky)
    assert "[default: 256; env ACTORLEARNER_BATCH_SIZE]" in " ".join(capsys.readouterr().out.split())


def test_learner_defaults_naming_no_learner_option_are_refused():
    class Typo(Tabular):
        learner_defaults: ClassVar[dict] = {"batch_sise": 256}

    with pytest.raises(ValueError, match="learner_defaults names no learner option: batch_sise"):
        cfg.build(cfg.LearnerConfig, None, {}, Typo)


def test_algorithm_name_precedence_flag_env_toml_default(tmp_path):
    toml = tmp_path / "a.toml"
    toml.write_text('algorithm = "from_toml:Algo"\n')
    env = {"ACTORLEARNER_ALGORITHM": "from_env:Algo"}
    assert cfg.algorithm_name(["--config", str(toml), "--algorithm", "from_flag:Algo"], env) == "from_flag:Algo"
    assert cfg.algorithm_name(["--config", str(toml), "--algorithm=from_flag:Algo"], env) == "from_flag:Algo"
    assert cfg.algorithm_name(["--config", str(toml)], env) == "from_env:Algo"
    assert cfg.algorithm_name(["--config", str(toml), "--port", "0"], {}) == "from_toml:Algo"
    assert cfg.algorithm_name(["--port", "0", "--dqn-lr", "0.1"], {}) == "dqn"
    assert cfg.algorithm_name([], {}) == cfg.LearnerConfig.algorithm == "dqn"
    assert cfg.algorithm_name(["--config", str(tmp_path / "missing.toml")], {}) == "dqn"  # build reports it
    no_name = tmp_path / "b.toml"
    no_name.write_text("seed = 1\n")
    assert cfg.algorithm_name(["--config", str(no_name)], {}) == "dqn"


def test_bad_values_name_their_source():
    with pytest.raises(ValueError, match="ACTORLEARNER_PORT"):
        cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, []), {"ACTORLEARNER_PORT": "eighty"})
    with pytest.raises(ValueError, match="--checkpoint-replay"):
        cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, ["--checkpoint-replay", "maybe"]), {})
    with pytest.raises(ValueError, match="ACTORLEARNER_DQN_LR"):
        cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, [], DQN), {"ACTORLEARNER_DQN_LR": "fast"}, DQN)
    with pytest.raises(ValueError, match="--dqn-hidden-sizes"):
        cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, ["--dqn-hidden-sizes", "8,wide"], DQN), {}, DQN)


def test_an_invalid_algorithm_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="n_step must be >= 1"):
        cfg.build(cfg.LearnerConfig, parse(cfg.LearnerConfig, ["--dqn-n-step", "0"], DQN), {}, DQN)
    toml = tmp_path / "bad.toml"
    toml.write_text("[dqn]\ntau = 2.0\n")
    with pytest.raises(ValueError, match="tau must be in"):
        cfg.build(cfg.RunConfig, parse(cfg.RunConfig, ["--config", str(toml)], DQN), {}, DQN)


def test_every_option_has_help_and_a_unique_flag():
    for cls in (cfg.LearnerConfig, cfg.ActorConfig, cfg.RunConfig, cfg.EnvServerConfig):
        opts = cfg.options(cls)
        assert all(o.help for o in opts), [o.flag for o in opts if not o.help]
        assert len({o.flag for o in opts}) == len(opts)
        assert "--algorithm-config" not in {o.flag for o in opts}  # set by the program, never an option
    for algorithm in (DQN, Tabular):
        learner = [*cfg.options(cfg.RunConfig), *cfg.options(algorithm.config_class, f"{algorithm.name}-")]
        assert all(o.help for o in learner), [o.flag for o in learner if not o.help]
        assert len({o.flag for o in learner}) == len(learner)
        assert len({o.env_var for o in learner}) == len(learner)


def test_readme_option_tables_and_code_map_are_current():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert render(readme) == readme, "README option tables or code map are stale: run `make docs`"
    for block in [*(f"options:{name}" for name in SECTIONS), "code-map"]:
        assert f"<!-- {block} -->" in readme and f"<!-- /{block} -->" in readme, f"README lacks its {block} block"


def test_the_code_map_names_every_module_with_its_docstring():
    package = Path(__file__).parents[2] / "actorlearner"
    mapped = code_map(package)
    modules = [p for p in package.rglob("*.py") if "v1" not in p.relative_to(package).parts]
    for path in modules:
        at = path.relative_to(package.parent).parent.as_posix()
        entry = f"`{at}/`" if path.name == "__init__.py" else f"`{path.name}`"
        assert entry in mapped, f"the code map lacks {path}"
    assert "`actorlearner/v1/`" in mapped and "_pb2" not in mapped  # generated code: one line
    undocumented = [str(p.relative_to(package)) for p in modules if summary(p) == UNDOCUMENTED]
    assert undocumented == [], f"modules without a docstring: {undocumented}"
    assert summary(package / "docs.py").startswith("Regenerate the README's generated parts")


def test_every_command_takes_its_options_from_a_config_dataclass_and_a_bad_value_is_one_usage_error(capsys):
    from actorlearner.cli import COMMANDS, main

    assert all(dataclasses.is_dataclass(config_class) and config_class.__doc__ for config_class, _, _ in
               COMMANDS.values())
    for argv, reason in [(["eval"], "a checkpoint is required"), (["export", "--checkpoint", "run"], "--out"),
                         (["eval", "--checkpoint", "run", "--episodes", "0"], "need --episodes"),
                         (["set", "lr"], "'lr' is not NAME=VALUE"), (["status", "--timeout", "soon"], "--timeout")]:
        with pytest.raises(SystemExit) as exited:
            main(argv)
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert exited.value.code == 2 and len(errors) == 1 and reason in errors[0], (argv, errors)


def test_main_leaves_a_callers_garbage_collector_as_it_found_it(tmp_path):
    """A command turns collection off while it starts and freezes start-up's objects once built
    (cli.common.started); called in a process that goes on (a test, an embedding program), main hands the
    collector back on and unfrozen, whether the command got that far (export) or ended first (run)."""
    from actorlearner.cli import main

    assert gc.isenabled() and gc.get_freeze_count() == 0
    for argv in (["export", "--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "policy.onnx")],
                 ["run", "--vector-mode", "bogus"]):
        assert main(argv) != 0
        assert gc.isenabled() and gc.get_freeze_count() == 0, argv


def test_a_bare_bool_flag_means_true():
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cfg.StatusConfig)
    assert cfg.build(cfg.StatusConfig, parser.parse_args(["--json"]), {}).json is True
    assert cfg.build(cfg.StatusConfig, parser.parse_args(["--json", "no"]), {}).json is False
    assert cfg.build(cfg.StatusConfig, parser.parse_args(["--no-json"]), {"ACTORLEARNER_JSON": "1"}).json is False


def test_run_refuses_an_unknown_vector_mode_before_starting_anything(caplog):
    from actorlearner.cli.run import run_command

    assert run_command(cfg.RunConfig(vector_mode="bogus")) == 2
    assert "--vector-mode must be one of auto, sync, async, workers, ahead, got 'bogus'" in caplog.text
