"""Atari 2600 games (``ALE/Pong-v5``, any ALE id) with the standard DQN preprocessing.

One frame of the agent is 4 emulator frames (the action repeated, the last two frames
max-pooled), as 84x84 greyscale uint8; each episode starts with 1 to 30 no-op steps. ALE v5's
sticky actions (0.25: the emulator repeats the previous action with that probability, per
frame) and its 108,000-frame cap stay on: the protocol of Machado et al. 2018, which
Dopamine's baselines follow. This is gymnasium's ``AtariPreprocessing`` over the game made
with ``frameskip=1``. Frame stacking is separate (``--frame-stack 4``).

Envs made for training (an actor's vector env) give each reward's sign (Mnih et al. 2015:
one learning rate fits every game's score scale); every other env (the learner's evaluator,
``actorlearner eval``, an env server) gives the raw game score, which is what papers report.
Switches ride on the name after ``?``, so the learner, its actors and ``eval`` all agree:
``ALE/Breakout-v5?episodic_life=true&noop_max=0`` (see :class:`AtariOptions`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from urllib.parse import parse_qsl

import gymnasium as gym
import numpy as np

PREFIX = "ALE/"
FRAME_SKIP = 4
"""Emulator frames per agent step: a benchmark's frames are env steps x FRAME_SKIP."""
SCREEN_SIZE = 84
INSTALL_HINT = "pip install actorlearner[atari]"


@dataclass(frozen=True)
class AtariOptions:
    """What an ALE name may set after ``?``, as ``key=value`` pairs joined by ``&``."""

    episodic_life: bool = False
    """Training envs end an episode at each lost life, and the next reset plays on from there
    (a real reset only once the game is over); evaluation always plays whole games. Off by
    default, as in Machado et al. 2018."""
    clip_rewards: bool = True
    """Training envs give each reward's sign; evaluation always gives the raw score."""
    noop_max: int = 30
    """Each game starts after a uniform 1 to noop_max no-op steps; 0: none."""
    repeat_action_probability: float = 0.25
    """Sticky actions: the chance, per emulator frame, that the previous action is repeated."""

    def __post_init__(self) -> None:
        if self.noop_max < 0:
            raise ValueError(f"noop_max must be >= 0, got {self.noop_max}")
        if not 0.0 <= self.repeat_action_probability < 1.0:
            raise ValueError(f"repeat_action_probability must be in [0, 1), got {self.repeat_action_probability}")


def is_atari(name: str) -> bool:
    """Whether ``name`` is an ALE game (``ALE/...``), which :func:`make_atari` makes."""
    return name.startswith(PREFIX)


def parse_name(name: str) -> tuple[str, AtariOptions]:
    """(the ALE id, its options) of ``ALE/Game-v5?key=value&...``; ValueError for an unknown key or a bad value."""
    game, _, query = name.partition("?")
    fields = {f.name: f for f in dataclasses.fields(AtariOptions)}
    values: dict = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"{name}: Atari options are key=value pairs joined by &") from None
    for key, text in pairs:
        if key not in fields:
            raise ValueError(f"{name}: unknown Atari option {key!r}; the options are {', '.join(fields)}")
        values[key] = _value(name, key, text, fields[key].type)
    return game, AtariOptions(**values)


def _value(name: str, key: str, text: str, kind: str):
    """``text`` as the option's type (bool: true/false/1/0)."""
    try:
        if kind == "bool":
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError("use true or false")
            return text.lower() in ("true", "1")
        return int(text) if kind == "int" else float(text)
    except ValueError as exc:
        raise ValueError(f"{name}: bad value {text!r} for {key}: {exc}") from None


def make_atari(name: str, render_mode: str | None = None, training: bool = False) -> gym.Env:
    """The ALE game ``name`` (options after ``?``) preprocessed for DQN; ValueError when it cannot be made.

    ``training``: rewards clipped to their sign and, with ``episodic_life``, a lost life ends
    the episode (see the module docstring); otherwise raw scores and whole games.
    """
    game, options = parse_name(name)
    try:
        import ale_py
    except ImportError as exc:
        raise ValueError(f"cannot make environment {name!r}: the Atari games need ale-py ({exc}); "
                         f"{INSTALL_HINT}") from None
    gym.register_envs(ale_py)
    try:
        env = gym.make(game, frameskip=1, repeat_action_probability=options.repeat_action_probability,
                       render_mode=render_mode)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make environment {name!r}: {exc}") from None
    try:
        env = gym.wrappers.AtariPreprocessing(env, noop_max=options.noop_max, frame_skip=FRAME_SKIP,
                                              screen_size=SCREEN_SIZE, grayscale_obs=True)
    except gym.error.DependencyNotInstalled as exc:
        env.close()
        raise ValueError(f"cannot make environment {name!r}: {exc}; {INSTALL_HINT}") from None
    if training and options.episodic_life:
        env = EpisodicLife(env)
    if training and options.clip_rewards:
        env = gym.wrappers.TransformReward(env, lambda reward: float(np.sign(reward)))
    return env


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (terminated); the next reset plays on with a no-op step
    instead of restarting, unless the game is over (Mnih et al. 2015, as OpenAI baselines)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info
