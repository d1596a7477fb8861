"""Regenerate the README's generated parts from the code: ``python -m actorlearner.docs README.md``.

The option tables come from the config dataclasses (one per command, and one per registered
algorithm: its options, prefixed with its name, then the learner defaults it sets); the code
map comes from the first paragraph of each module's and package's docstring.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from actorlearner import config as cfg
from actorlearner.algorithms import registry

SECTIONS = {"learner": cfg.LearnerConfig, "actor": cfg.ActorConfig, "env-server": cfg.EnvServerConfig,
            "relay": cfg.RelayConfig, "run": cfg.RunConfig, "status": cfg.StatusConfig, "set": cfg.SetConfig,
            "eval": cfg.EvalConfig, "export": cfg.ExportConfig}

PACKAGE = Path(__file__).resolve().parent
GENERATED = {"v1": "generated protobuf and gRPC code for proto/actorlearner/v1/ (`make proto`); never edited by hand"}
"""Packages summed up in one line of their own, their modules left out."""

UNDOCUMENTED = "**no docstring**"


def render(readme: str) -> str:
    """``readme`` with every ``<!-- options:NAME -->`` block and the ``<!-- code-map -->`` block made current."""
    blocks = {f"options:{name}": cfg.markdown_table(config_class) for name, config_class in SECTIONS.items()}
    for name in registry.REGISTERED:
        algorithm = registry.resolve(name)
        table = cfg.markdown_table(algorithm.config_class, f"{algorithm.name}-")
        defaults = getattr(algorithm, "learner_defaults", None)
        if defaults:
            shown = ", ".join(f"`--{key.replace('_', '-')} {value}`" for key, value in defaults.items())
            table += f"\n\nLearner defaults it sets (a flag, env var or TOML value overrides them): {shown}."
        blocks[f"options:{name}"] = table
    blocks["code-map"] = code_map()
    for name, text in blocks.items():
        block = f"<!-- {name} -->\n{text}\n<!-- /{name} -->"
        readme = re.sub(rf"<!-- {name} -->.*?<!-- /{name} -->", lambda _: block, readme, flags=re.S)
    return readme


def code_map(package: Path = PACKAGE) -> str:
    """Every package under ``package`` with its modules, one line each from its docstring, as Markdown."""
    lines = []
    for directory in sorted([package, *(p.parent for p in package.rglob("__init__.py") if p.parent != package)]):
        name = directory.relative_to(package.parent).as_posix()
        if directory.name in GENERATED:
            lines.append(f"- `{name}/`: {GENERATED[directory.name]}")
            continue
        if any(part in GENERATED for part in directory.relative_to(package).parts):
            continue
        lines.append(f"- `{name}/`: {summary(directory / '__init__.py')}")
        lines += [f"  - `{module.name}`: {summary(module)}" for module in sorted(directory.glob("*.py"))
                  if module.name != "__init__.py"]
    return "\n".join(lines)


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring on one line, reST roles and literals as Markdown code."""
    docstring = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    if not docstring:
        return UNDOCUMENTED
    text = " ".join(docstring.split("\n\n")[0].split())
    return re.sub(r"(?::\w+:)?``?([^`]+)``?", r"`\1`", text)


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
