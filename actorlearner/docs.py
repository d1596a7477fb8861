"""Regenerate the README's option tables from the config dataclasses: ``python -m actorlearner.docs``.

One table per command and one per registered algorithm (its options, prefixed with its name,
then the learner defaults it sets).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from actorlearner import config as cfg
from actorlearner.algorithms import registry

SECTIONS = {"learner": cfg.LearnerConfig, "actor": cfg.ActorConfig, "env-server": cfg.EnvServerConfig,
            "relay": cfg.RelayConfig, "run": cfg.RunConfig}


def render(readme: str) -> str:
    """``readme`` with every ``<!-- options:NAME -->`` block replaced by the current table."""
    tables = {name: cfg.markdown_table(config_class) for name, config_class in SECTIONS.items()}
    for name in registry.REGISTERED:
        algorithm = registry.resolve(name)
        tables[name] = cfg.markdown_table(algorithm.config_class, f"{algorithm.name}-")
        defaults = getattr(algorithm, "learner_defaults", None)
        if defaults:
            shown = ", ".join(f"`--{key.replace('_', '-')} {value}`" for key, value in defaults.items())
            tables[name] += f"\n\nLearner defaults it sets (a flag, env var or TOML value overrides them): {shown}."
    for name, table in tables.items():
        block = f"<!-- options:{name} -->\n{table}\n<!-- /options:{name} -->"
        readme = re.sub(rf"<!-- options:{name} -->.*?<!-- /options:{name} -->", lambda _: block, readme, flags=re.S)
    return readme


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
