"""Settings from flags, ``ACTORLEARNER_*`` env vars and TOML files, with the algorithm's options joined in.

The algorithm named by ``--algorithm`` adds its own config dataclass as a group of options
(``--dqn-lr``, ``ACTORLEARNER_DQN_LR``, TOML table ``[dqn]``), and its ``learner_defaults``
replace the learner's own defaults. Precedence: command-line flag, then environment variable,
then TOML file, then the env's preset (`presets`), then the algorithm's learner default, then default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from typing import Any

from actorlearner.config import presets
from actorlearner.config.learner import LearnerConfig
from actorlearner.config.options import Option, dest_name, options, parse_value, show_value


def add_arguments(parser: argparse.ArgumentParser, cls: type, algorithm: type | None = None) -> None:
    """Add ``--config`` and one flag per option of ``cls`` (defaults left to :func:`build`), and of
    ``algorithm``'s config (prefixed with its name) when ``cls`` holds a learner."""
    parser.add_argument("--config", help="TOML file with settings (flags and env vars override it)")
    defaults = algorithm_defaults(cls, algorithm)
    for opt in all_options(cls, algorithm):
        default = show_value(defaults.get(opt.path, opt.default))
        bare = {"nargs": "?", "const": True} if opt.kind is bool else {}  # a bare --flag means true
        parser.add_argument(opt.flag, dest=dest_name(opt), default=None, metavar=_metavar(opt.kind),
                            help=f"{opt.help} [default: {default}; env {opt.env_var}]", **bare)
        if opt.kind is bool:
            parser.add_argument(f"--no-{opt.flag[2:]}", dest=dest_name(opt), action="store_const", const=False,
                                help=f"the same as {opt.flag} false")


def all_options(cls: type, algorithm: type | None = None) -> list[Option]:
    """Every option of ``cls`` and, when it holds a learner, of ``algorithm``'s config (TOML paths under its name)."""
    if algorithm is None or _learner_path(cls) is None:
        return options(cls)
    return options(cls) + options(algorithm.config_class, f"{algorithm.name}-", (algorithm.name,))


def algorithm_defaults(cls: type, algorithm: type | None) -> dict[tuple[str, ...], Any]:
    """``algorithm``'s ``learner_defaults`` keyed by their option paths in ``cls``; ValueError names an
    entry that is no learner option."""
    path = _learner_path(cls)
    wanted = dict(getattr(algorithm, "learner_defaults", None) or {}) if path is not None else {}
    learner_options = {opt.path[-1] for opt in options(LearnerConfig)}
    unknown = sorted(set(wanted) - learner_options)
    if unknown:
        raise ValueError(f"algorithm {algorithm.name}: learner_defaults names no learner option: {', '.join(unknown)}")
    prefix = (path,) if path else ()
    return {prefix + (name,): value for name, value in wanted.items()}


def build(cls: type, args: argparse.Namespace | None = None, environ: typing.Mapping[str, str] | None = None,
          algorithm: type | None = None):
    """Make a ``cls`` from flags, env vars and the TOML file named by ``--config``.

    With ``algorithm`` (when ``cls`` holds a learner), the learner's ``algorithm_config`` is
    built the same way from the algorithm's prefixed options and its TOML table, and the preset
    ``--preset`` picks (`presets.preset`) fills the options none of those set; the learner's
    ``preset_applied`` says which.
    """
    environ = os.environ if environ is None else environ
    table: dict = {}
    if args is not None and getattr(args, "config", None):
        with open(args.config, "rb") as fh:
            table = tomllib.load(fh)
    defaults = algorithm_defaults(cls, algorithm)
    config = _build(cls, "", args, environ, table, defaults)
    path = _learner_path(cls)
    if algorithm is None or path is None:
        return config
    sub = table.get(algorithm.name, {})
    sub = sub if isinstance(sub, dict) else {}
    within = (path,) if path else ()
    tuned = presets.preset(algorithm.name, _walk(config, within + ("preset",)), _walk(config, within + ("env",)))
    own, algorithm_own = _preset_paths(cls, path, algorithm, tuned)
    if own:  # the preset's learner options, under what the user set
        config = _build(cls, "", args, environ, table, {**defaults, **{own[name]: tuned[name] for name in own}})
    algorithm_config = _build(algorithm.config_class, f"{algorithm.name}-", args, environ, sub,
                              {algorithm_own[name]: tuned[name] for name in algorithm_own})
    applied = {name: value for name, value in tuned.items()
               if (_walk(config, own[name]) if name in own else _walk(algorithm_config, algorithm_own[name])) == value}
    learner = dataclasses.replace(getattr(config, path) if path else config, algorithm_config=algorithm_config,
                                  preset_applied=applied)
    return dataclasses.replace(config, **{path: learner}) if path else learner


def _preset_paths(cls: type, path: str, algorithm: type, tuned: dict[str, Any]) -> tuple[dict, dict]:
    """The option paths of a preset's entries: (those of the learner's options in ``cls``, those of the
    algorithm config's), by name; ValueError names an entry that is neither."""
    within = (path,) if path else ()
    learner = {opt.flag[2:]: opt.path for opt in options(cls) if opt.path[:len(within)] == within}
    own = {opt.flag[2:]: opt.path for opt in options(algorithm.config_class, f"{algorithm.name}-")}
    unknown = sorted(set(tuned) - set(learner) - set(own))
    if unknown:
        raise ValueError(f"a preset for {algorithm.name} names no learner or {algorithm.name} option: "
                         f"{', '.join(unknown)}")
    return ({name: learner[name] for name in tuned if name in learner},
            {name: own[name] for name in tuned if name in own})


def _walk(config: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        config = getattr(config, name)
    return config


def algorithm_name(argv: typing.Sequence[str], environ: typing.Mapping[str, str] | None = None) -> str:
    """The ``--algorithm`` a command line asks for: flag, env var, TOML ``--config``, else the default."""
    environ = os.environ if environ is None else environ
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--algorithm")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(list(argv))
    if known.algorithm:
        return known.algorithm
    if "ACTORLEARNER_ALGORITHM" in environ:
        return environ["ACTORLEARNER_ALGORITHM"]
    if known.config and os.path.exists(known.config):
        with open(known.config, "rb") as fh:
            name = tomllib.load(fh).get("algorithm")
        if isinstance(name, str):
            return name
    return LearnerConfig.algorithm


def _learner_path(cls: type) -> str | None:
    """Where ``cls`` keeps its LearnerConfig: "" when it is one, a field name, or None."""
    if cls is LearnerConfig:
        return ""
    return next((f.name for f in dataclasses.fields(cls) if typing.get_type_hints(cls)[f.name] is LearnerConfig), None)


def _build(cls: type, prefix: str, args: argparse.Namespace | None, environ: typing.Mapping[str, str], table: dict,
           defaults: dict[tuple[str, ...], Any]):
    values: dict[tuple[str, ...], Any] = dict(defaults)
    for opt in options(cls, prefix):
        raw = getattr(args, dest_name(opt), None) if args is not None else None
        source = opt.flag
        if raw is None and opt.env_var in environ:
            raw, source = environ[opt.env_var], opt.env_var
        if raw is None:
            raw, source = _lookup(table, opt.path, cls), f"{args.config if args else ''}:{'.'.join(opt.path)}"
        if raw is not None:
            values[opt.path] = parse_value(raw, opt.kind, source)
    return _assemble(cls, values, ())


def _assemble(cls: type, values: dict, path: tuple[str, ...]):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _assemble(hints[f.name], values, path + (f.name,))
        elif path + (f.name,) in values:
            kwargs[f.name] = values[path + (f.name,)]
    return cls(**kwargs)


def _lookup(table: dict, path: tuple[str, ...], cls: type):
    """Find a value in a TOML table; flattened groups read from the enclosing table."""
    node: Any = table
    for i, part in enumerate(path):
        if i < len(path) - 1 and _is_flattened(cls, path[: i + 1]):
            continue
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _is_flattened(cls: type, path: tuple[str, ...]) -> bool:
    for part in path:
        f = {f.name: f for f in dataclasses.fields(cls)}[part]
        cls = typing.get_type_hints(cls)[part]
    return bool(f.metadata.get("flatten"))


def _metavar(kind: Any) -> str:
    if typing.get_origin(kind) is tuple:
        return "N,N,..."
    return {int: "N", float: "X", bool: "BOOL", str: "TEXT"}.get(kind, "VALUE")
