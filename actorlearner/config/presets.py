"""Per-task presets: settings a known env id learns faster with, applied to the options the user left unset.

Keyed by algorithm, then env id (as RL Zoo keeps tuned hyperparameters) or a family of ids (``ALE/*``: every
Atari game; an id's own preset comes first); each maps an option,
spelled as its flag without the dashes (``samples-per-insert``, ``dqn-n-step``: the names
``actorlearner set`` takes), to its value. `loading.build` applies the preset that ``--preset``
picks (by default the env's own) below flags, env vars and TOML and above the algorithm's learner
defaults. The measurements behind each are in benchmarks/RESULTS.md ("The classic control suite", "MinAtar",
"Atari", "Pendulum-v1 with SAC and TD3").
"""

from __future__ import annotations

from typing import Any

AUTO, NONE = "auto", "none"

# Each classic control task solved sooner with a 4x learning rate (5e-4 is the default, kept for image and
# custom envs) and an evaluation every 5 s instead of 10 (a run stops at the first evaluation past its
# target); MountainCar also with gamma 0.98, as RL Zoo's tuned DQN uses there (its -1 per step then
# values states over 50 steps, not 100). Each measured over seeds with bench_classic.py.
_CLASSIC_DQN = {"dqn-lr": 2e-3, "eval-every": 5.0}

# CartPole also with 16 samples per inserted transition instead of 8: on two cores the actors then take less of
# the CPU the learner needs: about 1.1x the updates a second, and fewer of them solve it (9.7k against about 11k).
# Over 6 seeds the held solve came in a median 43 s instead of 55 s, the slowest seed in 57 s instead of 60 s.
# And with a target network that follows the online one by 0.5% each update instead of a copy every 250: on a
# faster machine (about 1,000 updates a second) the hard copies let a solved policy fall back between two
# evaluations (one seed in six took 3.6x the median to hold its solve); over 18 runs the slowest held solve
# went from 78 s to 38 s, the median from 21.5 s to 26.5 s, the mean from 30.5 s to 25.2 s.
_CARTPOLE_DQN = {**_CLASSIC_DQN, "samples-per-insert": 16.0, "dqn-tau": 0.005, "dqn-target-update-period": 1}

# MinAtar's games (10x10 grids of a few bool channels): the paper's network, one conv layer then one 128-unit
# layer, instead of the default's two (the Breakout curves in RESULTS were measured with it).
_MINATAR_DQN = {"dqn-hidden-sizes": (128,)}
_MINATAR_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")

# Atari games on a CPU learner: an evaluation of 20 whole games every 10 s (a Pong game lasts about 800
# steps of the Nature CNN) took the cores from training; 5 games every 60 s leave them to it.
_ATARI_DQN = {"eval-every": 60.0, "eval-episodes": 5}

# Pendulum with SAC: 64-unit layers instead of the default's 256 (kept for other envs). On one core an update of
# the wide networks costs about 25 ms; the narrow ones solved in about 60% of the wall time, in 10-45% more
# updates.
_PENDULUM_SAC = {"sac-hidden-sizes": (64, 64)}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "dqn": {
        "CartPole-v1": _CARTPOLE_DQN,
        "Acrobot-v1": _CLASSIC_DQN,
        "LunarLander-v3": _CLASSIC_DQN,
        "MountainCar-v0": {**_CLASSIC_DQN, "dqn-gamma": 0.98},
        **{f"MinAtar/{game}-{version}": _MINATAR_DQN for game in _MINATAR_GAMES for version in ("v0", "v1")},
        "ALE/*": _ATARI_DQN,
    },
    "sac": {"Pendulum-v1": _PENDULUM_SAC},
}


def preset(algorithm: str, choice: str, env: str) -> dict[str, Any]:
    """The settings ``--preset choice`` gives ``algorithm`` on ``env``: the env's own preset for "auto" (none
    when it has none), nothing for "none", else the preset of the env id named; ValueError for an unknown one."""
    if choice == NONE:
        return {}
    tuned = PRESETS.get(algorithm, {})
    if choice == AUTO:
        return dict(tuned.get(env, tuned.get(family(env), {})))
    if choice not in tuned:
        known = ", ".join(sorted(tuned)) or "none"
        raise ValueError(f"--preset {choice!r}: {algorithm} has no preset for it; use auto, none or one of: {known}")
    return dict(tuned[choice])


def family(env: str) -> str:
    """The family key of an env id: ``ALE/Pong-v5`` -> ``ALE/*``; the id itself when it names none."""
    return f"{env.split('/', 1)[0]}/*" if "/" in env else env


def describe(applied: dict[str, Any]) -> str:
    """The settings a preset gave, as flags would spell them: ``n-step=5 lr=0.001``."""
    return " ".join(f"{name}={','.join(map(str, value)) if isinstance(value, tuple) else value}"
                    for name, value in applied.items())
