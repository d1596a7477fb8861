"""Learner, actor and data-parallel rank processes forked from one process that imported them once.

A fresh ``python -m actorlearner learner`` spends about 8 CPU-s before it serves (torch, the learner's
modules, the dynamo its first optimizer imports, numba) and an actor about 4.5; the suite starts a few
hundred such processes on two cores. The zygote, one per pytest process, imports all of that once and,
asked over a Unix socket, forks a child that runs ``actorlearner.cli.main(argv)`` (or another function
of an importable module, as tests/support/data_parallel_worker.py's ``main``) with the environment,
stdin, stdout and stderr the test gave: a real process of its own, with its own pid, signals, children,
sockets and exit code, that skips only the interpreter's start. `ForkedProcess` is what the test holds,
with the part of `subprocess.Popen` the tests use.

The zygote itself never starts a thread, a gRPC channel or a server, so what it forks holds no lock
or connection of its own. It ends with the pytest process (the kernel's parent-death signal) and
takes its children with it; each child also ends with the zygote.

Run as a script, this module is the zygote: ``python zygote.py FD``, FD its end of the socket pair.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

MESSAGE_BYTES = 1 << 20


class Zygote:
    """The test's end: start the zygote, ask it for children, learn how they ended."""

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self.socket = ours
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}

    def fork(self, call: tuple[str, str, list], env: dict[str, str], stdio: tuple[int, int, int],
             argv: list[str] | None = None) -> int:
        """The pid of a new child that calls ``module.function(*args)`` (``call``) with ``env``, fds ``stdio`` as 0,
        1, 2 and ``argv`` as sys.argv; its exit code is what the function returns (or raises as SystemExit)."""
        with self.lock:
            request = {"call": call, "env": env, "cwd": os.getcwd(), "argv": argv or [call[0], *map(str, call[2])]}
            socket.send_fds(self.socket, [json.dumps(request).encode()], list(stdio))
            while True:
                reply = self._receive()
                if "pid" in reply:
                    return reply["pid"]

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """How child ``pid`` ended (as `subprocess.Popen.returncode`), or None if it runs on after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while pid not in self.exits:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not select.select([self.socket], [], [], left)[0]:
                    return None
                self._receive()
            return self.exits[pid]

    def _receive(self) -> dict:
        data = self.socket.recv(MESSAGE_BYTES)
        if not data:
            raise RuntimeError(f"the zygote ended (exit {self.process.poll()})")
        reply = json.loads(data)
        if "exit" in reply:
            self.exits[reply["exit"]] = reply["code"]
        return reply


class ForkedProcess:
    """A child of the zygote, held as a `subprocess.Popen` is: pid, poll, wait, signals, pipes."""

    def __init__(self, zygote: Zygote, args: list[str], env: dict[str, str], stdout=None, stderr=None,
                 text: bool = False, call: tuple[str, str, list] | None = None):
        """``args``: ``sys.executable -m actorlearner ...``, run as ``actorlearner.cli.main(args[3:])`` unless
        ``call`` names another function; ``stdout`` and ``stderr`` as `subprocess.Popen` takes them."""
        self.args, self.zygote, self.returncode = args, zygote, None
        self.stdout = self.stderr = None
        stdio, opened, readers = [os.open(os.devnull, os.O_RDONLY)], [], {}
        opened.append(stdio[0])
        for name, target in (("stdout", stdout), ("stderr", stderr)):
            if target == subprocess.PIPE:
                read, write = os.pipe()
                readers[name] = os.fdopen(read, "r" if text else "rb")
                stdio.append(write)
                opened.append(write)
            elif target == subprocess.DEVNULL:
                stdio.append(os.open(os.devnull, os.O_WRONLY))
                opened.append(stdio[-1])
            elif target == subprocess.STDOUT:
                stdio.append(stdio[1])
            elif target is None:
                stdio.append(len(stdio))  # this process's own stdout or stderr
            else:
                stdio.append(target if isinstance(target, int) else target.fileno())
        try:
            self.pid = zygote.fork(call or ("actorlearner.cli", "main", [args[3:]]), env, tuple(stdio),
                                   argv=None if call else ["actorlearner", *args[3:]])
        finally:
            for fd in opened:
                os.close(fd)
        for name, reader in readers.items():
            setattr(self, name, reader)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None):
        """(stdout, stderr), each read to its end while the other is (a child filling one pipe while the test
        waits on the other would stall), then the exit; `subprocess.TimeoutExpired` past ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pipes = [pipe for pipe in (self.stdout, self.stderr) if pipe]
        read: dict = {}
        readers = [threading.Thread(target=lambda pipe=pipe: read.update({pipe: pipe.read()}), daemon=True)
                   for pipe in pipes]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return read.get(self.stdout), read.get(self.stderr)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# ------------------------------------------------------------------------------------------- the zygote


def _child(request: dict, stdio: list[int], zygote_fd: int) -> None:
    """In the forked child: the test's fds and environment, then the call."""
    import importlib

    from actorlearner.lifeline import end_with_parent

    os.close(zygote_fd)
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    end_with_parent(os.getppid())
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    module, function, args = request["call"]
    sys.argv = request["argv"]  # what argparse's usage lines name
    sys.exit(getattr(importlib.import_module(module), function)(*args))


def _serve(fd: int) -> None:
    import multiprocessing
    from multiprocessing.connection import wait

    from actorlearner.lifeline import end_with_parent

    end_with_parent(os.getppid())
    _preload()
    sock = socket.socket(fileno=fd)
    fork = multiprocessing.get_context("fork")
    children: dict[int, multiprocessing.Process] = {}
    try:
        while True:
            ready = wait([sock, *(child.sentinel for child in children.values())])
            for pid, child in list(children.items()):
                if child.sentinel in ready and child.exitcode is not None:
                    sock.send(json.dumps({"exit": pid, "code": child.exitcode}).encode())
                    del children[pid]
            if sock in ready:
                message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 3)
                if not message:
                    return
                child = fork.Process(target=_child, args=(json.loads(message), fds, fd))
                child.start()
                for passed in fds:
                    os.close(passed)
                children[child.pid] = child
                sock.send(json.dumps({"pid": child.pid}).encode())
    finally:
        for child in children.values():
            child.kill()


def _preload() -> None:
    """What every command imports, and what a learner's first optimizer and replay kernels load."""
    import numba
    import torch

    import actorlearner.actor.actor  # noqa: F401
    import actorlearner.cli.actor  # noqa: F401
    import actorlearner.cli.learner  # noqa: F401
    import actorlearner.learner.server  # noqa: F401
    import data_parallel_worker  # noqa: F401

    torch.optim.Adam(torch.nn.Linear(1, 1).parameters())  # imports torch._dynamo
    numba.njit(lambda x: x + 1)(1)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
