"""``actorlearner learner|actor|env-server|relay|run|status|set|eval|export``: the binaries users run."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc

from actorlearner import config as cfg
from actorlearner.algorithms import resolve as resolve_algorithm
from actorlearner.curve import LearningCurve
from actorlearner.health import CONNECTED, Health
from actorlearner.metrics import serve_metrics
from actorlearner.telemetry import format_progress
from actorlearner.transport import SecurityConfig, open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger("actorlearner")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="actorlearner", description=__doc__)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    algorithm = None
    if command in ("learner", "run"):  # the algorithm's options are the learner's too: resolve it first
        try:
            algorithm = resolve_algorithm(cfg.algorithm_name(argv))
        except ValueError as exc:
            parser.error(str(exc))
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (config_class, _, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=config_class.__doc__)
        cfg.add_arguments(sub, config_class, algorithm)
    status = commands.add_parser("status", help="print a learner's status")
    status.add_argument("--learner", default="127.0.0.1:50051", help="learner address HOST:PORT")
    status.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    cfg.add_arguments(status, SecurityConfig)
    setter = commands.add_parser("set", help="change runtime parameters of a running learner (and its actors)")
    setter.add_argument("--learner", default="127.0.0.1:50051", help="learner address HOST:PORT")
    setter.add_argument("parameters", nargs="+", metavar="NAME=VALUE",
                        help="an option flagged 'Changeable while training runs', without dashes: "
                             "samples-per-insert=4 dqn-lr=1e-4 dqn-epsilon-base=0.2")
    setter.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    cfg.add_arguments(setter, SecurityConfig)
    exporting = commands.add_parser("export", help="write a checkpoint's greedy policy as an ONNX file and FILE.json")
    exporting.add_argument("--checkpoint", required=True,
                           help="a run directory, a checkpoint directory (its newest usable one) or one checkpoint")
    exporting.add_argument("--out", required=True, help="the ONNX file to write; its sidecar is FILE.json")
    exporting.add_argument("--env", default="", help="env whose spaces it takes (default: the one it was trained on)")
    exporting.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    evaluation = commands.add_parser("eval", help="play a checkpoint's policy greedily and report its returns")
    evaluation.add_argument("--checkpoint", required=True,
                            help="a run directory, a checkpoint directory (its newest usable one) or one checkpoint")
    evaluation.add_argument("--env", default="", help="env to play (default: the one it was trained on)")
    evaluation.add_argument("--episodes", type=int, default=20, help="greedy episodes to play")
    evaluation.add_argument("--envs", type=int, default=4, help="envs the episodes are spread over")
    evaluation.add_argument("--seed", type=int, default=0, help="env i is reset with seed + i")
    evaluation.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    evaluation.add_argument("--video", metavar="DIR", default="",
                            help="record the first --video-episodes episodes (env 0's, then env 1's, ...) as MP4s "
                                 "in DIR, named env-I-episode-J.mp4; the env must render rgb_array frames")
    evaluation.add_argument("--video-episodes", type=int, default=3, metavar="K",
                            help="episodes --video records (default: 3)")
    evaluation.add_argument("--opponents", default="", metavar="MODULE:FUNCTION,...",
                            help="a self-play (multi-agent) policy: the scripted players to play --episodes games "
                                 "against each, seats alternated")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        if args.command == "status":
            return status_command(args.learner, args.json, args.timeout, cfg.build(SecurityConfig, args))
        if args.command == "set":
            return set_command(args.learner, args.parameters, args.timeout, cfg.build(SecurityConfig, args))
        if args.command == "export":
            return export_command(args.checkpoint, args.out, args.env, args.json)
        if args.command == "eval":
            return eval_command(args.checkpoint, args.env, args.episodes, args.envs, args.seed, args.json,
                                args.video, args.video_episodes, args.opponents)
        config_class, command, _ = COMMANDS[args.command]
        config = cfg.build(config_class, args, algorithm=algorithm)
    except ValueError as exc:
        parser.error(str(exc))
    return command(config)


def on_signals(handler) -> None:
    """Call ``handler()`` on SIGTERM and SIGINT."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: handler())


def learner_command(config: cfg.LearnerConfig) -> int:
    """Serve until SIGTERM/SIGINT (exit 0) or a training failure (exit 1); then report NOT_SERVING,
    stop accepting, checkpoint."""
    from actorlearner.learner.learner import Learner
    from actorlearner.learner.server import serve

    warn_if_exposed(config.host, config.security)
    learner = _start_learner(Learner, config)  # restores the newest good checkpoint, buffer included
    if learner is None:
        return 2
    stop = threading.Event()
    on_signals(stop.set)
    health = Health()
    with serve(learner, config.host, config.port, health=health) as port, \
            _metrics(config.host, config.metrics_port, learner.metrics):
        learner.start()
        health.set(True)
        print(f"learner listening on {config.host}:{port}", flush=True)
        while not (stop.wait(5.0) or learner.failed.is_set() or learner.stopping.is_set()):  # or another rank's stop
            logger.info("%s", format_progress(learner.progress()))
        health.set(False)  # draining: probes see NOT_SERVING while the final checkpoint is written
        logger.info("stopping: actors told to go, final checkpoint")
        learner.stop()
    return 1 if learner.failed.is_set() else 0


def actor_command(config: cfg.ActorConfig) -> int:
    """Act until SIGTERM/SIGINT; then flush unacked batches and exit 0.

    Exit 2, with one ERROR line and no traceback, if the learner refused this actor or sent
    settings or weights it cannot apply (``LinkError``).
    """
    from actorlearner.actor.actor import Actor
    from actorlearner.actor.link import LinkError

    actor = Actor(config)
    on_signals(actor.stop)
    health = Health()
    if config.health_port:
        health.listen(config.listen_host, config.health_port)
        health.set(True)
        threading.Thread(target=_report_connection, args=(actor, health), daemon=True, name="health").start()
    try:
        with _metrics(config.listen_host, config.metrics_port, actor.metrics):
            actor.run()
    except LinkError as exc:
        logger.error("%s", exc)
        return 2
    finally:
        health.close()
    logger.info("actor %s stopped after %d env steps, %d batches", actor.actor_id, actor.env_steps, actor.batches_sent)
    return 0


def _report_connection(actor, health: Health) -> None:
    """Keep the actor's "connected" health service in step with its learner stream."""
    while not actor.stop_event.wait(0.5):
        health.set(actor.link.connected, CONNECTED)


@contextlib.contextmanager
def _metrics(host: str, port: int, read):
    """Serve Prometheus metrics on ``port`` for the duration of the block (nothing when 0)."""
    if not port:
        yield
        return
    server, bound = serve_metrics(host, port, read)
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    try:
        yield
    finally:
        server.shutdown()


def env_server_command(config: cfg.EnvServerConfig) -> int:
    """Serve ``config.env`` until SIGTERM/SIGINT (reported NOT_SERVING while closing); exit 0."""
    from actorlearner.envs import make_env
    from actorlearner.envs.server import serve

    warn_if_exposed(config.host, config.security)
    stop = threading.Event()
    on_signals(stop.set)
    health = Health()
    with serve(lambda: make_env(config.env), config.env, config.host, config.port, config.max_sessions,
               config.max_message_bytes, config.security, health) as (service, port), \
            _metrics(config.host, config.metrics_port, service.metrics):
        health.set(True)
        print(f"env server listening on {config.host}:{port}", flush=True)
        stop.wait()
        health.set(False)
        logger.info("stopping: closing sessions")
    return 0


def relay_command(config: cfg.RelayConfig) -> int:
    """Relay actors to ``config.upstream`` until SIGTERM/SIGINT (exit 0), or exit 2 if the upstream
    refuses the relay for good. Health is SERVING while the upstream stream is up."""
    from actorlearner.relay.server import serve

    warn_if_exposed(config.host, config.security)
    stop = threading.Event()
    on_signals(stop.set)
    health = Health()
    with serve(config, health) as (relay, port), _metrics(config.host, config.metrics_port, relay.metrics):
        print(f"relay listening on {config.host}:{port}", flush=True)
        while not stop.wait(1.0) and not relay.failed.is_set():
            health.set(relay.up)
        health.set(False)
    if relay.error is not None:
        logger.error("%s", relay.error)
        return 2
    return 0


def run_command(config: cfg.RunConfig) -> int:
    """Learner in this process, actors as child processes; exit 0 if solved, 1 if time ran out."""
    from actorlearner.learner.learner import Learner
    from actorlearner.learner.server import serve

    if config.learner.world_size > 1:
        logger.error("run trains one learner; data-parallel ones are 'actorlearner learner --world-size N' each")
        return 2
    run_dir = config.run_dir or new_run_dir(config.learner)
    learner_config = dataclasses.replace(
        config.learner, host="127.0.0.1", port=0, num_actors=config.actors, world_size=1,  # WORLD_SIZE set or not
        checkpoint_dir=config.learner.checkpoint_dir or os.path.join(run_dir, "checkpoints"),
        logdir=config.learner.logdir or os.path.join(run_dir, "tb"))
    learner = _start_learner(Learner, learner_config)
    if learner is None:
        return 2
    stop = threading.Event()
    on_signals(stop.set)
    start = time.monotonic()
    solved = False
    curve, evaluations = LearningCurve(), 0
    with serve(learner, "127.0.0.1", 0) as port:
        learner.start()
        actors = [_spawn_actor(config, port, i) for i in range(config.actors)]
        last_print = 0.0
        while not stop.wait(0.5):
            elapsed = time.monotonic() - start
            new_eval = learner.evaluations > evaluations
            evaluations = learner.evaluations
            curve.record(elapsed, learner.env_steps, learner.recent_return, learner.eval_mean if new_eval else None)
            solved = learner.evaluations > 0 and learner.eval_mean >= config.target_return
            if solved or elapsed >= config.max_seconds:
                break
            if all(a.poll() is not None for a in actors):
                logger.error("every actor exited; stopping")
                break
            if learner.failed.is_set():
                break
            if elapsed - last_print >= 2.0:
                last_print = elapsed
                sps = learner.env_steps / max(elapsed, 1e-9)
                print(f"[{elapsed:6.1f}s] {format_progress({**learner.progress(), 'sps': sps})}", file=sys.stderr, flush=True)
        _stop_processes(actors)
    learner.stop()  # joins an evaluation already under way; its result counts
    elapsed = time.monotonic() - start
    curve.record(elapsed, learner.env_steps, learner.recent_return,
                 learner.eval_mean if learner.evaluations > evaluations else None)
    solved = learner.evaluations > 0 and learner.eval_mean >= config.target_return
    result = {"solved": solved, "eval_return": learner.eval_mean if learner.evaluations else None,
              "seconds": round(elapsed, 2), "env_steps": learner.env_steps,
              "updates": learner.updates, "policy_version": learner.version, "run_dir": run_dir}
    if config.plot:
        result["curve"] = os.path.join(run_dir, "curve.png")
        curve.save_png(result["curve"], f"{learner_config.algorithm} on {learner_config.env}, seed {learner_config.seed}")
        print(f"learning curve: {result['curve']}", file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)
    return 0 if solved else 1


COMMANDS = {
    "learner": (cfg.LearnerConfig, learner_command, "serve actors: replay, training, weight broadcast"),
    "actor": (cfg.ActorConfig, actor_command, "run environments and stream transitions to a learner"),
    "env-server": (cfg.EnvServerConfig, env_server_command,
                   "serve an environment over env.proto, one instance per session"),
    "relay": (cfg.RelayConfig, relay_command, "serve actors as a learner does, over one stream to the learner"),
    "run": (cfg.RunConfig, run_command, "a learner and N actors on loopback until solved or out of time"),
}


def new_run_dir(config: cfg.LearnerConfig) -> str:
    """``runs/<env>-<algorithm>-<date-time>``, with characters a path cannot hold replaced by ``_``."""
    name = f"{config.env}-{config.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
    return os.path.join("runs", re.sub(r"[^A-Za-z0-9._-]", "_", name))


def _start_learner(learner_class, config: cfg.LearnerConfig):
    """The learner, or None after one ERROR line saying why it cannot be built (an env space the
    algorithm cannot learn from, an unknown algorithm, bad settings); no traceback."""
    try:
        return learner_class(config)
    except ValueError as exc:
        logger.error("cannot start the learner: %s", exc)
        return None


def _spawn_actor(config: cfg.RunConfig, port: int, index: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "actorlearner", "actor", "--learner", f"127.0.0.1:{port}",
               "--env", config.learner.env, "--num-envs", str(config.num_envs),
               "--seed", str(config.learner.seed * 1000 + index), "--actor-id", f"actor-{index}"]
    security = {opt.env_var: str(value) for opt in cfg.options(SecurityConfig)
                if (value := getattr(config.learner.security, opt.path[-1]))}  # by env var: no token in ps
    return subprocess.Popen(command, env={**os.environ, **security})


def _stop_processes(processes: list[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL whatever has not exited by ``timeout``."""
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in processes:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def status_command(address: str, as_json: bool, timeout: float, security: SecurityConfig) -> int:
    """Print GetStatus as a table or one JSON object; exit 1 if the learner does not answer."""
    with open_channel(address, security) as channel:
        try:
            status: pb.StatusResponse = pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            print(f"learner at {address} did not answer: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    actors = [{"id": a.actor_id, "policy_version": a.policy_version, "lag": a.lag, "connected": a.connected,
               "batches_per_second": round(a.batches_per_second, 2), "inserted": a.inserted,
               "duplicates": a.duplicates, "last_seen_unix": a.last_seen_unix, "via": a.via, "relay": a.relay}
              for a in status.actors]
    summary = {"learner_id": status.learner_id, "policy_version": status.policy_version, "updates": status.updates,
               "buffer_size": status.buffer_size, "inserted": status.inserted, "env_steps": status.env_steps,
               "insert_rate": round(status.insert_rate, 1), "sample_rate": round(status.sample_rate, 1),
               "eval_mean_return": status.eval_mean_return if status.evaluations else None,
               "parameters": {p.name: p.value for p in status.parameters},
               "changed_parameters": {p.name: p.value for p in status.changed_parameters}, "actors": actors}
    if status.HasField("league"):
        summary["league"] = league_summary(status.league)
    if as_json:
        print(json.dumps(summary))
        return 0
    for key, value in summary.items():
        if key not in ("actors", "parameters", "changed_parameters", "league"):
            print(f"{key:18s} {value}")
    for name, value in summary["parameters"].items():
        changed = " (set while running)" if name in summary["changed_parameters"] else ""
        print(f"{name:18s} {value}{changed}")
    print(f"{'actor':24s} {'version':>8s} {'lag':>5s} {'batches/s':>10s} {'stored':>8s} {'dupes':>6s} connected via")
    for a in actors:
        via = "(relay)" if a["relay"] else a["via"]
        print(f"{a['id']:24s} {a['policy_version']:8d} {a['lag']:5d} {a['batches_per_second']:10.2f} "
              f"{a['inserted']:8d} {a['duplicates']:6d} {a['connected']!s:9s} {via}")
    if "league" in summary:
        league = summary["league"]
        print(f"league: rating {league['rating']:.0f}, {league['games']} games, "
              f"{league['snapshots']}/{league['max_snapshots']} snapshots")
        print(f"{'opponent':40s} {'rating':>7s} {'draw':>6s} {'W/D/L':>16s} {'eval W/D/L':>14s}")
        for o in league["opponents"]:
            evaluated = "/".join(map(str, o["eval"])) if o["eval"] else "-"
            rating = "-" if o["rating"] is None else f"{o['rating']:.0f}"
            print(f"{o['id']:40s} {rating:>7s} {o['weight']:6.3f} {o['wins']:>5d}/{o['draws']}/{o['losses']:<5d} "
                  f"{evaluated:>14s}")
    return 0


def league_summary(league: pb.LeagueStatus) -> dict:
    """The league part of ``status``: the current rating and each opponent's record, rating and evaluation."""
    evaluated = {r.opponent: (r.wins, r.draws, r.losses) for r in league.evaluation}
    opponents = [{"id": o.opponent.id, "rating": round(o.opponent.rating, 1), "weight": round(o.opponent.weight, 4),
                  "wins": o.wins, "draws": o.draws, "losses": o.losses, "eval": evaluated.pop(o.opponent.id, None)}
                 for o in league.opponents]
    opponents += [{"id": name, "rating": None, "weight": 0.0, "wins": 0, "draws": 0, "losses": 0, "eval": record}
                  for name, record in evaluated.items()]  # evaluation-only scripted players
    return {"rating": round(league.rating, 1), "games": league.games, "snapshots": league.snapshots,
            "max_snapshots": league.max_snapshots, "unrated_games": league.unrated_games, "opponents": opponents}


def set_command(address: str, assignments: list[str], timeout: float, security: SecurityConfig) -> int:
    """SetParameters with NAME=VALUE pairs; prints each change, or the learner's reason and exit 1."""
    parameters = []
    for assignment in assignments:
        name, equals, value = assignment.partition("=")
        if not equals or not name.strip():
            print(f"{assignment!r} is not NAME=VALUE", file=sys.stderr)
            return 2
        parameters.append(pb.Parameter(name=name.strip(), value=value.strip()))
    with open_channel(address, security) as channel:
        try:
            answer = pb_grpc.LearnerStub(channel).SetParameters(pb.SetParametersRequest(parameters=parameters),
                                                                timeout=timeout)
        except grpc.RpcError as exc:
            print(f"learner at {address} refused: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    for before, after in zip(answer.previous, answer.applied):
        print(f"{after.name}: {before.value} -> {after.value}")
    return 0


def eval_command(checkpoint: str, env: str, episodes: int, num_envs: int, seed: int, as_json: bool,
                 video: str = "", video_episodes: int = 3, opponents: str = "") -> int:
    """Print a checkpoint's greedy returns (mean, std, min, max), and with ``video`` the MP4s recorded
    of its first ``video_episodes`` episodes; exit 1 if it cannot be loaded or its env cannot render.
    A self-play policy plays ``opponents`` instead (see :func:`games_command`)."""
    from actorlearner.learner.checkpoint import CheckpointError
    from actorlearner.trained import evaluate_trained, load_trained, record_trained

    if episodes < 1 or num_envs < 1 or video_episodes < 1:
        print(f"need --episodes, --envs and --video-episodes >= 1, got {episodes}, {num_envs} and {video_episodes}",
              file=sys.stderr)
        return 2
    try:
        trained = load_trained(checkpoint, env)
    except (CheckpointError, ValueError) as exc:
        print(f"cannot load {checkpoint}: {exc}", file=sys.stderr)
        return 1
    if trained.game:
        return games_command(trained, [name.strip() for name in opponents.split(",") if name.strip()], episodes,
                             num_envs, seed, as_json)
    videos = []
    if video:
        try:
            result, videos = record_trained(trained, episodes, num_envs, seed, video, video_episodes)
        except ValueError as exc:
            print(f"cannot record videos: {exc}", file=sys.stderr)
            return 1
    else:
        result = evaluate_trained(trained, episodes, num_envs, seed)
    summary = {"episodes": result.episodes, "mean_return": result.mean, "std_return": result.std,
               "min_return": result.min, "max_return": result.max}
    if as_json:
        print(json.dumps({**summary, "videos": [str(path) for path in videos]} if video else summary))
        return 0
    print(f"{trained.algorithm} on {trained.env} from {trained.source}")
    for key, value in summary.items():
        print(f"{key:12s} {value:g}")
    for path in videos:
        print(f"{'video':12s} {path}")
    return 0


def games_command(trained, opponents: list[str], games: int, num_envs: int, seed: int, as_json: bool) -> int:
    """Print a self-play policy's wins, draws, losses and mean return against each scripted player."""
    from actorlearner.trained import play_trained

    if not opponents:
        print(f"{trained.env} has several agents: name the players to play with --opponents MODULE:FUNCTION,...",
              file=sys.stderr)
        return 2
    try:
        played = play_trained(trained, opponents, games, num_envs, seed)
    except ValueError as exc:
        print(f"cannot play: {exc}", file=sys.stderr)
        return 1
    summary = {"games": games, "opponents": {
        name: {"wins": outcomes["win"], "draws": outcomes["draw"], "losses": outcomes["loss"],
               "mean_return": result.mean} for name, result, outcomes in played}}
    if as_json:
        print(json.dumps(summary))
        return 0
    print(f"{trained.algorithm} on {trained.env} from {trained.source}: {games} games against each, seats alternated")
    for name, record in summary["opponents"].items():
        print(f"{name:50s} {record['wins']:4d} won {record['draws']:4d} drawn {record['losses']:4d} lost  "
              f"mean return {record['mean_return']:g}")
    return 0


def export_command(checkpoint: str, out: str, env: str, as_json: bool) -> int:
    """Write a checkpoint's greedy policy to ``out`` (ONNX) and ``out.json``; exit 1 if it cannot be
    loaded or exported."""
    from actorlearner.export import export_onnx, sidecar_path
    from actorlearner.learner.checkpoint import CheckpointError
    from actorlearner.trained import load_trained

    try:
        trained = load_trained(checkpoint, env)
        verified = export_onnx(trained, out)["verified"]
    except (CheckpointError, ValueError) as exc:  # ExportError is a ValueError
        print(f"cannot export {checkpoint}: {exc}", file=sys.stderr)
        return 1
    written = {"onnx": out, "sidecar": str(sidecar_path(out)), "verified": verified}
    if as_json:
        print(json.dumps(written))
        return 0
    print(f"{trained.algorithm} on {trained.env} from {trained.source}")
    print(f"wrote {written['onnx']} and {written['sidecar']}")
    print(f"checked with {verified['runtime']}: it acts as the policy on {verified['envs']} envs x {verified['steps']} "
          "steps" if verified else "not checked: onnxruntime is not installed")
    return 0


def warn_if_exposed(host: str, security: SecurityConfig) -> None:
    """Log loudly when a server listens beyond loopback with nothing keeping strangers out."""
    if not security.authenticated and not _is_loopback(host):
        logger.warning("!!! listening on %s WITHOUT AUTHENTICATION: every host that can reach it may connect; "
                       "set --auth-token-file (or ACTORLEARNER_AUTH_TOKEN) and TLS !!!", host)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, ``localhost`` or a host name) surely binds loopback only.

    A host name other than localhost is not resolved: it may name any interface, so it counts as exposed.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # "" and host names
        return False
