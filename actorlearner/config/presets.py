"""Per-task presets: settings a known env id learns faster with, applied to the options the user left unset.

Keyed by algorithm, then env id (as RL Zoo keeps tuned hyperparameters); each maps an option,
spelled as its flag without the dashes (``samples-per-insert``, ``dqn-n-step``: the names
``actorlearner set`` takes), to its value. `loading.build` applies the preset that ``--preset``
picks (by default the env's own) below flags, env vars and TOML and above the algorithm's learner
defaults. The measurements behind each are in benchmarks/RESULTS.md ("The classic control suite").
"""

from __future__ import annotations

from typing import Any

AUTO, NONE = "auto", "none"

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "dqn": {
    },
}


def preset(algorithm: str, choice: str, env: str) -> dict[str, Any]:
    """The settings ``--preset choice`` gives ``algorithm`` on ``env``: the env's own preset for "auto" (none
    when it has none), nothing for "none", else the preset of the env id named; ValueError for an unknown one."""
    if choice == NONE:
        return {}
    tuned = PRESETS.get(algorithm, {})
    if choice == AUTO:
        return dict(tuned.get(env, {}))
    if choice not in tuned:
        known = ", ".join(sorted(tuned)) or "none"
        raise ValueError(f"--preset {choice!r}: {algorithm} has no preset for it; use auto, none or one of: {known}")
    return dict(tuned[choice])


def describe(applied: dict[str, Any]) -> str:
    """The settings a preset gave, as flags would spell them: ``n-step=5 lr=0.001``."""
    return " ".join(f"{name}={','.join(map(str, value)) if isinstance(value, tuple) else value}"
                    for name, value in applied.items())
