"""Child processes that end with their parent, however it ends (SIGKILL included): the kernel's parent-death
signal, which a child asks for as it starts."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PARENT_ENV = "ACTORLEARNER_PARENT_PID"
"""Set by a command that starts another of this package's commands as a child (``run``'s actors): the pid
the child must not outlive."""

_PR_SET_PDEATHSIG = 1


def end_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send this process ``sig`` once ``parent_pid``, its parent, ends; at once if it has
    already ended. A no-op where the kernel has no such signal (outside Linux).

    The signal comes when the parent's thread that started this process ends, so a parent starts such
    children from a thread that lives as long as it does (every command here: its main thread).
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # it ended before the request above
        os.kill(os.getpid(), sig)


def end_with_parent_from_env(sig: int = signal.SIGTERM) -> None:
    """:func:`end_with_parent` for a command whose parent named itself in ``ACTORLEARNER_PARENT_PID``."""
    parent = os.environ.pop(PARENT_ENV, "")
    if parent.isdigit():
        end_with_parent(int(parent), sig)


def tied_to_this_process(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for `subprocess.Popen`: the child, between fork and exec, asks the kernel for ``sig``
    once the thread starting it ends, as :func:`end_with_parent` asks; None where the kernel has no such signal.
    For a script's children that are not this package's forked processes (a benchmark's commands)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it

    def ask() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return ask
