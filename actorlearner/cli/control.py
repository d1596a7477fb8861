"""``actorlearner status`` and ``set``: read a running learner's state, and change its runtime parameters."""

from __future__ import annotations

import json

import grpc

from actorlearner.cli.common import failed
from actorlearner.config import SetConfig, StatusConfig
from actorlearner.transport import open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc


def status_command(config: StatusConfig) -> int:
    """Print GetStatus as a table or one JSON object; exit 1 if the learner does not answer."""
    with open_channel(config.learner, config.security) as channel:
        try:
            status: pb.StatusResponse = pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(),
                                                                             timeout=config.timeout)
        except grpc.RpcError as exc:
            return failed(f"learner at {config.learner} did not answer: {exc.code().name}: {exc.details()}")
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
    if config.json:
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


def set_command(config: SetConfig) -> int:
    """SetParameters with NAME=VALUE pairs; prints each change, or the learner's reason and exit 1."""
    parameters = [pb.Parameter(name=name, value=value) for name, value in config.assignments()]
    with open_channel(config.learner, config.security) as channel:
        try:
            answer = pb_grpc.LearnerStub(channel).SetParameters(pb.SetParametersRequest(parameters=parameters),
                                                                timeout=config.timeout)
        except grpc.RpcError as exc:
            return failed(f"learner at {config.learner} refused: {exc.code().name}: {exc.details()}")
    for before, after in zip(answer.previous, answer.applied):
        print(f"{after.name}: {before.value} -> {after.value}")
    return 0
