"""``actorlearner learner|actor|env-server|relay|run|status|set|eval|export``: the binaries users run.

Every command is a config dataclass and a function of it: its flags, env vars and TOML keys
come from the dataclass (:mod:`actorlearner.config`), a bad value is one usage error (exit 2),
and the function returns the exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import sys

from actorlearner import config as cfg
from actorlearner.cli.actor import actor_command
from actorlearner.cli.after_training import eval_command, export_command
from actorlearner.cli.common import started
from actorlearner.cli.control import set_command, status_command
from actorlearner.cli.env_server import env_server_command
from actorlearner.cli.learner import learner_command
from actorlearner.cli.relay import relay_command
from actorlearner.cli.run import run_command

COMMANDS = {
    "learner": (cfg.LearnerConfig, learner_command, "serve actors: replay, training, weight broadcast"),
    "actor": (cfg.ActorConfig, actor_command, "run environments and stream transitions to a learner"),
    "env-server": (cfg.EnvServerConfig, env_server_command,
                   "serve an environment over env.proto, one instance per session"),
    "relay": (cfg.RelayConfig, relay_command, "serve actors as a learner does, over one stream to the learner"),
    "run": (cfg.RunConfig, run_command, "a learner and N actors on loopback until solved, out of time or trained"),
    "status": (cfg.StatusConfig, status_command, "print a learner's status"),
    "set": (cfg.SetConfig, set_command, "change runtime parameters of a running learner (and its actors)"),
    "eval": (cfg.EvalConfig, eval_command, "play a checkpoint's policy greedily and report its returns"),
    "export": (cfg.ExportConfig, export_command, "write a checkpoint's greedy policy as an ONNX file and FILE.json"),
}
"""Command name -> (its config dataclass, the function that runs it and returns the exit code, one-line help)."""


BUILDS_FIRST = ("learner", "run", "actor")
"""The long-running commands: each calls :func:`~actorlearner.cli.common.started` once it has built its parts."""


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point: run the command ``argv`` names; its exit code."""
    gc.disable()  # start-up's objects live as long as the process: collecting them is wasted (common.started)
    try:
        return _run_command(sys.argv[1:] if argv is None else argv)
    finally:  # as it was for a caller in the same process, and on a path that ended before started()
        gc.unfreeze()
        gc.enable()


def command_line() -> None:
    """The ``actorlearner`` executable: :func:`main`, then exit at once. A command has closed what it wrote by
    then; the interpreter's teardown would only walk the objects start-up made (two seconds for a learner) and
    report those of its libraries' extensions that are still alive as leaked."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="actorlearner", description=__doc__.splitlines()[0])
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    algorithm = None
    if command in ("learner", "run"):  # the algorithm's options are the learner's too: resolve it first
        from actorlearner.algorithms import resolve as resolve_algorithm  # torch: only commands that train load it

        try:
            algorithm = resolve_algorithm(cfg.algorithm_name(argv))
        except ValueError as exc:
            parser.error(str(exc))
    commands = parser.add_subparsers(dest="command", required=True)
    parsers = {}
    for name, (config_class, _, help_text) in COMMANDS.items():
        parsers[name] = commands.add_parser(name, help=help_text, description=config_class.__doc__)
        cfg.add_arguments(parsers[name], config_class, algorithm)
    parsers["set"].add_argument("parameters", nargs="+", metavar="NAME=VALUE",
                                help="an option flagged 'Changeable while training runs', without dashes: "
                                     "samples-per-insert=4 dqn-lr=1e-4 dqn-epsilon-base=0.2")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    config_class, run, _ = COMMANDS[args.command]
    try:
        config = cfg.build(config_class, args, algorithm=algorithm)
        if "parameters" in args:
            config = dataclasses.replace(config, parameters=tuple(args.parameters))
    except ValueError as exc:
        parsers[args.command].error(str(exc))
    if args.command not in BUILDS_FIRST:
        started()
    return run(config)
