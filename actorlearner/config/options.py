"""How a config dataclass's fields become options: flag, env var, type, default and help from its docstring.

Each field's docstring (the string literal under it) is its help text. A nested dataclass
field becomes a group of options prefixed with its name unless it is marked ``flatten``; a
field marked ``option: False`` is set by the program, never by the user.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "ACTORLEARNER_"

RUNTIME = {"runtime": True}
"""Field metadata of an option that may change while training runs (``actorlearner set``)."""


def runtime_options(cls: type) -> tuple[str, ...]:
    """The fields of config dataclass ``cls`` marked `RUNTIME`."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("runtime"))


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each field of a dataclass and of the dataclasses it extends."""
    docs = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


@dataclass(frozen=True)
class Option:
    """One leaf setting: where it lives in the nested config and how it is spelled."""

    path: tuple[str, ...]
    flag: str
    env_var: str
    kind: Any
    default: Any
    help: str


def options(cls: type, prefix: str = "", path: tuple[str, ...] = ()) -> list[Option]:
    """Every leaf option of a config class, nested ones included."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("option") is False:
            continue
        kind = hints[f.name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(kind):
            sub = prefix if f.metadata.get("flatten") else f"{prefix}{f.name}-"
            out += options(kind, sub, path + (f.name,))
            continue
        name = f"{prefix}{f.name}".replace("_", "-")
        help_text = docs.get(f.name, "")
        if f.metadata.get("runtime"):
            help_text += " Changeable while training runs (`actorlearner set`)."
        out.append(Option(path + (f.name,), f"--{name}", ENV_PREFIX + name.replace("-", "_").upper(),
                          kind, default, help_text))
    return out


def parse_value(raw: Any, kind: Any, source: str) -> Any:
    """Convert a flag, env var or TOML value to the field's type; name the source on error."""
    try:
        if typing.get_origin(kind) is tuple:
            (item, _) = typing.get_args(kind)
            parts = raw if isinstance(raw, (list, tuple)) else [p for p in str(raw).split(",") if p.strip()]
            return tuple(item(p) for p in parts)
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        return kind(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None


def comma_separated(text: str) -> list[str]:
    """The non-empty, stripped items of a comma-separated option."""
    return [item.strip() for item in text.split(",") if item.strip()]


def dest_name(opt: Option) -> str:
    """The argparse destination of ``opt``'s flag."""
    return opt.flag[2:].replace("-", "_")


def show_value(value: Any) -> str:
    """A value as a flag would spell it, for help texts and tables."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, str) else str(value)


def markdown_table(cls: type, prefix: str = "") -> str:
    """The options of ``cls`` (flags prefixed with ``prefix``) as a Markdown table, for the README."""
    rows = ["| flag | env var | default | meaning |", "|---|---|---|---|"]
    for opt in options(cls, prefix):
        rows.append(f"| `{opt.flag}` | `{opt.env_var}` | `{show_value(opt.default)}` | {opt.help} |")
    return "\n".join(rows)
