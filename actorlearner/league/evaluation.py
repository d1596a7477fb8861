"""Greedy games of a self-play policy against given opponents, seats alternated env by env."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from actorlearner import wire
from actorlearner.algorithms import Policy
from actorlearner.evaluation import EvalResult, evaluate, summarize
from actorlearner.league.league import League
from actorlearner.league.opponents import PolicyPlayer, ScriptedPlayer, load_scripted
from actorlearner.league.seat import Game, Player, SeatEnv
from actorlearner.v1 import learner_pb2 as pb


def play_games(policy: Policy, make_env: Callable[[], Any], make_player: Callable[[int], Player], games: int,
               num_envs: int, seed: int) -> tuple[EvalResult, Counter]:
    """``games`` greedy games of ``policy`` against the player ``make_player(i)`` makes for env ``i``;
    env i starts at seat i, so the seats alternate. Returns the learning seat's returns and its
    outcomes (win, draw, loss). A recurrent policy or opponent plays on one env."""
    played: list[Game] = []
    slots = itertools.count()

    def seat_env():
        slot = next(slots)
        player = make_player(slot)
        return SeatEnv(make_env(), lambda: player, played.append, first_seat=slot)
    result = evaluate(lambda obs: policy.act(obs, 0.0), seat_env, games, 1 if policy.recurrent else min(num_envs, games),
                      seed, policy.reset_memory)
    return result, Counter(g.outcome for g in played)


def scripted(name: str, spaces: tuple[gym.Space, gym.Space], seed: int) -> Callable[[int], Player]:
    """A maker of scripted player ``name`` for env slot i (seeded ``seed + i``)."""
    return lambda slot: ScriptedPlayer(name, load_scripted(name, *spaces, seed + slot))


def evaluate_league(league: League, policy: Policy, opponent: Policy, make_env: Callable[[], Any],
                    spaces: tuple[gym.Space, gym.Space], num_envs: int, seed: int) -> EvalResult:
    """``league.config.eval_games`` games against each scripted player (the league's and the
    evaluation-only ones) and each of the ``eval_snapshots`` newest snapshots, played by
    ``opponent`` with the league's opponent exploration. The records go to ``league.evaluation``;
    the result summarizes the learning seat's returns over every game."""
    settings = league.config
    players = [(name, scripted(name, spaces, seed)) for name in settings.evaluated_players()]
    for snapshot, payload in league.sample_snapshots(settings.eval_snapshots):
        def snapshot_player(slot, snapshot=snapshot, payload=payload):
            opponent.load_policy_state_dict(wire.decode_state_dict(payload))
            return PolicyPlayer(snapshot, opponent, spaces[0], settings.opponent_exploration)
        players.append((snapshot, snapshot_player))
    if settings.eval_games < 1 or not players:
        raise ValueError("nothing to evaluate against: no scripted players (--league-scripted, --league-eval-scripted) "
                         "and no snapshots yet, or --league-eval-games 0")
    records, results = [], []
    for name, make_player in players:
        result, outcomes = play_games(policy, make_env, make_player, settings.eval_games, num_envs, seed)
        records.append(pb.EvalRecord(opponent=name, wins=outcomes["win"], draws=outcomes["draw"],
                                     losses=outcomes["loss"]))
        results.append(result)
    league.evaluation = records
    return summarize([r for result in results for r in result.returns],
                     [n for result in results for n in result.lengths])
