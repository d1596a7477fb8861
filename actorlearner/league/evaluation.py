"""Evaluation of a self-play policy: greedy games against each scripted player and the newest snapshots."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from actorlearner import wire
from actorlearner.algorithms import Algorithm
from actorlearner.config import LearnerConfig
from actorlearner.league.league import League
from actorlearner.league.opponents import PolicyPlayer, ScriptedPlayer, load_scripted
from actorlearner.league.seat import Game, Player, SeatEnv
from actorlearner.learner.evaluator import EvalResult, evaluate
from actorlearner.v1 import learner_pb2 as pb


def evaluate_league(league: League, policy: Algorithm, opponent: Algorithm, make_env: Callable[[], Any],
                    spaces: tuple[gym.Space, gym.Space], config: LearnerConfig, seed: int) -> EvalResult:
    """``league.config.eval_games`` games against each scripted player and each of the
    ``eval_snapshots`` newest snapshots (played by ``opponent``), seats alternated env by env.

    The records go to ``league.evaluation``; the result summarizes the learning seat's returns
    over every game.
    """
    settings = league.config
    space, actions = spaces
    players: list[tuple[str, Callable[[int], Player]]] = [
        (script, lambda slot, s=script: ScriptedPlayer(s, load_scripted(s, space, actions, seed + slot)))
        for script in settings.evaluated_players()]
    for snapshot, payload in league.sample_snapshots(settings.eval_snapshots):
        def snapshot_player(slot, snapshot=snapshot, payload=payload):
            opponent.load_policy_state_dict(wire.decode_state_dict(payload))
            return PolicyPlayer(snapshot, opponent, space, settings.opponent_exploration)
        players.append((snapshot, snapshot_player))
    recurrent = hasattr(policy, "reset_memory")
    records, returns, lengths = [], [], []
    for name, make_player in players:
        if settings.eval_games < 1:
            break
        games: list[Game] = []
        slots = itertools.count()

        def seat_env(games=games, slots=slots, make_player=make_player):
            slot = next(slots)
            player = make_player(slot)
            return SeatEnv(make_env(), lambda: player, games.append, first_seat=slot)
        result = evaluate(lambda obs: policy.act(obs, 0.0), seat_env, settings.eval_games,
                          1 if recurrent else min(config.eval_envs, settings.eval_games), seed,
                          getattr(policy, "reset_memory", None))
        counts = Counter(g.outcome for g in games)
        records.append(pb.EvalRecord(opponent=name, wins=counts["win"], draws=counts["draw"], losses=counts["loss"]))
        returns.extend(result.returns)
        lengths.extend(result.lengths)
    league.evaluation = records
    if not returns:
        raise ValueError("nothing to evaluate against: no scripted players (--league-scripted) and no snapshots yet")
    values = np.asarray(returns, dtype=np.float64)
    return EvalResult(mean=float(values.mean()), std=float(values.std()), min=float(values.min()),
                      max=float(values.max()), episodes=len(values), lengths=tuple(lengths), returns=tuple(returns))
