"""Dataclass configs, one module per command: one source for CLI flags, TOML files and ``ACTORLEARNER_*`` env vars."""

from actorlearner.config.actor import ActorConfig
from actorlearner.config.after_training import EvalConfig, ExportConfig
from actorlearner.config.control import SetConfig, StatusConfig
from actorlearner.config.env_server import EnvServerConfig
from actorlearner.config.league import LeagueConfig
from actorlearner.config.learner import LearnerConfig
from actorlearner.config.loading import add_arguments, algorithm_name, all_options, build
from actorlearner.config.options import (ENV_PREFIX, RUNTIME, markdown_table, options, parse_value,
                                         runtime_options, show_value)
from actorlearner.config.relay import RelayConfig
from actorlearner.config.run import RunConfig

__all__ = ["ENV_PREFIX", "RUNTIME", "ActorConfig", "EnvServerConfig", "EvalConfig", "ExportConfig", "LeagueConfig",
           "LearnerConfig", "RelayConfig", "RunConfig", "SetConfig", "StatusConfig", "add_arguments",
           "algorithm_name", "all_options", "build", "markdown_table", "options", "parse_value",
           "runtime_options", "show_value"]
