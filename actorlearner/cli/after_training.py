"""``actorlearner eval`` and ``export``: play a checkpoint's policy greedily, or write it as an ONNX file."""

from __future__ import annotations

import json

from actorlearner.cli.common import failed
from actorlearner.config import EvalConfig, ExportConfig


def eval_command(config: EvalConfig) -> int:
    """Print a checkpoint's greedy returns (mean, std, min, max), and with ``video`` the MP4s recorded
    of its first ``video_episodes`` episodes; exit 1 if it cannot be loaded or its env cannot render.
    A self-play policy plays ``opponents`` instead (see :func:`games_command`)."""
    from actorlearner.checkpoint.parts import CheckpointError
    from actorlearner.trained import evaluate_trained, load_trained, record_trained

    try:
        trained = load_trained(config.checkpoint, config.env)
    except (CheckpointError, ValueError) as exc:
        return failed(f"cannot load {config.checkpoint}: {exc}")
    if trained.game:
        return games_command(trained, config)
    videos = []
    if config.video:
        try:
            result, videos = record_trained(trained, config.episodes, config.envs, config.seed, config.video,
                                            config.video_episodes, config.max_steps)
        except ValueError as exc:
            return failed(f"cannot record videos: {exc}")
    else:
        result = evaluate_trained(trained, config.episodes, config.envs, config.seed, config.max_steps)
    summary = {"episodes": result.episodes, "mean_return": result.mean, "std_return": result.std,
               "min_return": result.min, "max_return": result.max}
    if config.json:
        print(json.dumps({**summary, "videos": [str(path) for path in videos]} if config.video else summary))
        return 0
    print(f"{trained.algorithm} on {trained.env} from {trained.source}")
    for key, value in summary.items():
        print(f"{key:12s} {value:g}")
    for path in videos:
        print(f"{'video':12s} {path}")
    return 0


def games_command(trained, config: EvalConfig) -> int:
    """Print a self-play policy's wins, draws, losses and mean return against each scripted player."""
    from actorlearner.trained import play_trained

    opponents, games = config.opponent_names(), config.episodes
    if not opponents:
        return failed(f"{trained.env} has several agents: name the players to play with --opponents "
                      "MODULE:FUNCTION,...", 2)
    try:
        played = play_trained(trained, opponents, games, config.envs, config.seed)
    except ValueError as exc:
        return failed(f"cannot play: {exc}")
    summary = {"games": games, "opponents": {
        name: {"wins": outcomes["win"], "draws": outcomes["draw"], "losses": outcomes["loss"],
               "mean_return": result.mean} for name, result, outcomes in played}}
    if config.json:
        print(json.dumps(summary))
        return 0
    print(f"{trained.algorithm} on {trained.env} from {trained.source}: {games} games against each, seats alternated")
    for name, record in summary["opponents"].items():
        print(f"{name:50s} {record['wins']:4d} won {record['draws']:4d} drawn {record['losses']:4d} lost  "
              f"mean return {record['mean_return']:g}")
    return 0


def export_command(config: ExportConfig) -> int:
    """Write a checkpoint's greedy policy to ``out`` (ONNX) and ``out.json``; exit 1 if it cannot be
    loaded or exported."""
    from actorlearner.export import export_onnx, sidecar_path
    from actorlearner.checkpoint.parts import CheckpointError
    from actorlearner.trained import load_trained

    try:
        trained = load_trained(config.checkpoint, config.env)
        verified = export_onnx(trained, config.out)["verified"]
    except (CheckpointError, ValueError) as exc:  # ExportError is a ValueError
        return failed(f"cannot export {config.checkpoint}: {exc}")
    written = {"onnx": config.out, "sidecar": str(sidecar_path(config.out)), "verified": verified}
    if config.json:
        print(json.dumps(written))
        return 0
    print(f"{trained.algorithm} on {trained.env} from {trained.source}")
    print(f"wrote {written['onnx']} and {written['sidecar']}")
    print(f"checked with {verified['runtime']}: it acts as the policy on {verified['envs']} envs x {verified['steps']} "
          "steps" if verified else "not checked: onnxruntime is not installed")
    return 0
