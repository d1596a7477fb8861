"""``python -m actorlearner``: the same as the ``actorlearner`` command."""

import sys

from actorlearner.cli import main

sys.exit(main())
