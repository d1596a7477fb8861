"""The peer for bench_classic.py: Stable-Baselines3's DQN with RL Zoo's tuned settings, written plainly from
their documented APIs (nothing of actorlearner's).

Trains one seed with the settings in rl_zoo3's ``hyperparams/dqn.yml`` for the task (its ``n_timesteps``
is the training budget, so the exploration schedule is the one RL Zoo tuned) and, on the protocol
bench_classic.py gives both sides, plays ``--eval-episodes`` greedy episodes every ``--eval-every`` wall
seconds, counting the evaluation's time. It stops once ``--holds`` evaluations in a row reach
``--target``, at the budget, or after ``--max-seconds``. Prints one JSON line per evaluation
(``seconds``, ``env_steps``, ``eval_return``) and a last one with ``final`` and the versions.

    python benchmarks/peer_sb3.py --env CartPole-v1 --seed 0 --target 475 --holds 2
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.resources
import json
import time

import gymnasium as gym
import numpy as np
import yaml
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback


def zoo_settings(env_id: str) -> dict:
    """RL Zoo's tuned DQN settings for ``env_id``, as DQN keyword arguments plus ``n_timesteps``."""
    path = importlib.resources.files("rl_zoo3") / "hyperparams" / "dqn.yml"
    settings = dict(yaml.safe_load(path.read_text())[env_id])
    if isinstance(settings.get("policy_kwargs"), str):  # written as "dict(net_arch=[256, 256])"
        call = ast.parse(settings["policy_kwargs"], mode="eval").body
        settings["policy_kwargs"] = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    return settings


def greedy_return(model: DQN, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` deterministic episodes on a fresh env."""
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


class WallClockEvaluation(BaseCallback):
    """Evaluates every ``every`` wall seconds after the previous evaluation ended; stops training when
    ``holds`` evaluations in a row reach ``target`` or ``max_seconds`` have passed."""

    def __init__(self, env_id: str, target: float, holds: int, every: float, episodes: int, max_seconds: float,
                 seed: int):
        super().__init__()
        self.env_id, self.target, self.holds, self.every = env_id, target, holds, every
        self.episodes, self.max_seconds, self.seed = episodes, max_seconds, seed
        self.start = self.last = time.monotonic()
        self.in_a_row = self.evaluations = 0

    def _on_step(self) -> bool:
        now = time.monotonic()
        if now - self.start >= self.max_seconds:
            return False
        if now - self.last < self.every:
            return True
        mean = greedy_return(self.model, self.env_id, self.episodes, self.seed + 10_000 * self.evaluations)
        self.evaluations += 1
        self.last = time.monotonic()
        print(json.dumps({"seconds": round(self.last - self.start, 2), "env_steps": self.num_timesteps,
                          "eval_return": mean}), flush=True)
        self.in_a_row = self.in_a_row + 1 if mean >= self.target else 0
        return self.in_a_row < self.holds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True, help="a task RL Zoo's dqn.yml tunes, e.g. CartPole-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, required=True, help="evaluation mean return that solves the task")
    parser.add_argument("--holds", type=int, default=2, help="evaluations in a row at the target that solve it")
    parser.add_argument("--eval-every", type=float, default=5.0, help="wall seconds between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=20, help="greedy episodes per evaluation")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="wall-clock cap")
    args = parser.parse_args()

    settings = zoo_settings(args.env)
    budget = int(settings.pop("n_timesteps"))
    callback = WallClockEvaluation(args.env, args.target, args.holds, args.eval_every, args.eval_episodes,
                                   args.max_seconds, args.seed)
    model = DQN(env=gym.make(args.env), seed=args.seed, verbose=0, **settings)
    callback.start = callback.last = time.monotonic()  # the clock starts with training, as the run's does
    model.learn(total_timesteps=budget, callback=callback)
    print(json.dumps({"final": True, "env_steps": model.num_timesteps, "budget": budget,
                      "seconds": round(time.monotonic() - callback.start, 2), "settings": settings,
                      "versions": {name: importlib.metadata.version(name)
                                   for name in ("stable_baselines3", "rl_zoo3", "torch", "gymnasium")}},
                     default=str), flush=True)


if __name__ == "__main__":
    main()
