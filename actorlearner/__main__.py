"""``python -m actorlearner``: the same as the ``actorlearner`` command."""

from actorlearner.cli import command_line

command_line()
