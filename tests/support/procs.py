"""Real learner and actor processes for the multi-process tests, polling helpers, and what /proc says of
a process (its children, command line, start time)."""

from __future__ import annotations

import atexit
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from zygote import ForkedProcess, Zygote

# Small and quick: training starts early and publishes often. The rate limiter is the default one;
# a test that needs another passes it and says why.
FAST_LEARNER = ["--env", "CartPole-v1", "--replay-capacity", "20000", "--min-replay-size", "256",
                "--batch-size", "64", "--publish-every", "5", "--eval-every", "0",
                "--dqn-hidden-sizes", "32,32"]


# The start of a child script that must run without actorlearner: importing it fails there, as on a
# machine where it is not installed, and the script exits at once if it does not.
WITHOUT_ACTORLEARNER = """
import sys
sys.modules["actorlearner"] = None
try:
    import actorlearner
except ImportError:
    pass
else:
    sys.exit("actorlearner was importable")
"""

# Children import the tests' own environments and algorithms (custom_envs:..., plugin_algorithm:...).
LISTENING = re.compile(r"listening on [\d.]+:(\d+)")
"""The first line a server the tests start prints: "learner listening on 127.0.0.1:PORT"."""

CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                                      os.environ.get("PYTHONPATH")]))}


FORKED = ("learner", "actor", "run", "eval", "export")
"""The commands `launch` and `run_command` fork from the zygote (zygote.py): those that import torch. The env
server is left to start as a user starts it (it must not load torch), as is every command a test starts by
`subprocess` itself (a test of the executable's own start or exit)."""
_zygote: Zygote | None = None


def launch(command: list[str], **popen) -> subprocess.Popen | ForkedProcess:
    """``command`` (``sys.executable -m actorlearner ...``) as a process: a command of `FORKED`
    forked from this pytest process's zygote when asked from the main thread (the zygote must end with this
    process, and the kernel ties it to the thread that started it), any other with `subprocess.Popen`."""
    if command[1:3] != ["-m", "actorlearner"] or command[3] not in FORKED or \
            threading.current_thread() is not threading.main_thread():
        proc = subprocess.Popen(command, **popen)
        _popened[:] = [*(p for p in _popened if p.returncode is None), proc]
        return proc
    return fork(command, None, **popen)


_popened: list[subprocess.Popen] = []
"""What `launch` started with `subprocess.Popen` and has not seen end. An env server or a relay has no parent
to end with (a user's has none either), so one that a failing test started and never stopped would outlive
this pytest process: `_end_popened` kills those left as this process exits."""


@atexit.register
def _end_popened() -> None:
    for proc in _popened:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_command(command: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout)`` through `launch`: an
    ``actorlearner`` command that imports torch forked from the zygote; killed past ``timeout``."""
    proc = launch(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def fork(args: list[str], call: tuple[str, str, list] | None, **popen) -> ForkedProcess:
    """A process forked from this pytest process's zygote (started on first use, from the main thread) that
    runs ``args`` (``sys.executable -m actorlearner ...``) or ``call`` (module, function, arguments); ``popen``:
    env, stdout, stderr and text, as `subprocess.Popen` takes them."""
    global _zygote
    if _zygote is None:
        assert threading.current_thread() is threading.main_thread(), "the zygote starts from the main thread"
        _zygote = Zygote(CHILD_ENV)
    return ForkedProcess(_zygote, args, dict(popen.get("env", os.environ)), stdout=popen.get("stdout"),
                         stderr=popen.get("stderr"), text=popen.get("text", False), call=call)


PACED_ENV = "custom_envs:paced_cartpole"
"""CartPole at 2 ms a step (same spaces), for an actor whose stream is only background, not load: it streams
steadily without running a core flat out."""
PACED = ["--env", PACED_ENV]


def start_learner(*args: str, port: int = 0) -> tuple[subprocess.Popen, int]:
    """``actorlearner learner --port PORT`` (0: any); returns the process and the port it printed."""
    return started([sys.executable, "-m", "actorlearner", "learner", "--port", str(port), *args], "learner",
                   env=CHILD_ENV)


def start_actor(port: int, actor_id: str, *args: str, stderr=None) -> subprocess.Popen:
    """An actor process of 2 envs stepped in its own process (``--vector-mode sync``; ``args`` may say otherwise):
    the default, auto, spawns a second process per actor (ahead), whose start and two busy cores per actor slow
    the suite's many streaming tests on a 2-core machine by a third. The default itself is tested where it
    matters: test_vector_mode.py, test_ahead.py, in-process actors, and every learning test's ``run``."""
    return launch([sys.executable, "-m", "actorlearner", "actor", "--learner", f"127.0.0.1:{port}",
                   "--actor-id", actor_id, "--num-envs", "2", "--vector-mode", "sync", *args],
                  stderr=stderr, env=CHILD_ENV)


def loads_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's library mapped (it imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def free_port() -> int:
    """A loopback port nothing listens on right now (for a process that must come back on the same port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` in KiB (VmRSS in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def status(port: int, host: str = "127.0.0.1") -> pb.StatusResponse:
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=5)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stop(*procs: subprocess.Popen, timeout: float = 60) -> list[int]:
    """SIGTERM each process and return the exit codes (SIGKILL past ``timeout``: generous, since a
    draining process shares two cores with the other xdist workers' processes)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


# A learner that takes batches and never trains (its replay never reaches min_replay_size).
NOT_TRAINING = ["--min-replay-size", "1000000000", "--replay-capacity", "20000", "--eval-every", "0"]


def process_children(pid: int) -> set[int]:
    """The pids of ``pid``'s child processes."""
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children.update(int(c) for c in (task / "children").read_text().split())
        except OSError:  # the thread ended meanwhile
            pass
    return children


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, theirs, ...), each with its start time."""
    found, todo = {}, [pid]
    while todo:
        try:
            children = process_children(todo.pop())
        except OSError:  # it ended meanwhile
            continue
        for child in children:
            if (started := start_time(child)) is not None:
                found[child] = started
                todo.append(child)
    return found


def alive(processes: dict[int, str]) -> dict[int, str]:
    """Those of ``processes`` (pid: start time) still running (a reused pid is another process)."""
    return {pid: started for pid, started in processes.items() if start_time(pid) == started}


def process_report(processes: dict[int, str]) -> str:
    """For a failure message: each of ``processes`` still running, with its command line, state, signal masks
    (pending, blocked, ignored, caught) and where each of its threads waits."""
    lines = []
    for pid in alive(processes):
        try:
            status_lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            fields = " ".join(line.replace("\t", "") for line in status_lines
                              if line.startswith(("State", "PPid", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
            threads = [f"{Path(task, 'comm').read_text().strip()}@{Path(task, 'wchan').read_text().strip()}"
                       for task in sorted(Path(f"/proc/{pid}/task").iterdir())]
        except OSError:  # it ended meanwhile
            continue
        lines.append(f"{pid} [{cmdline(pid)[:100]}] {fields} threads: {', '.join(threads)}")
    return "; ".join(lines) or "none"


def cmdline(pid: int) -> str:
    """``pid``'s command line, space-separated (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), None once it is gone or a zombie: with the pid it
    names one process, whatever later reuses the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def status_if(port: int, predicate):
    """The learner's status when ``predicate`` holds for it, else None (for :func:`wait_until`)."""
    current = status(port)
    return current if predicate(current) else None


def start_rank(rank: int, address: str, *args: str) -> subprocess.Popen:
    """One rank of a world of two on this host, on the default device: with LOCAL_RANK as torchrun sets it, on
    a CUDA machine each rank takes a GPU of its own (NCCL), or both the one there is (gloo)."""
    return launch([sys.executable, "-m", "actorlearner", "learner", "--port", "0", "--env", "CartPole-v1",
                   "--seed", "0", "--world-size", "2", "--rank", str(rank), "--dist-address", address,
                   "--num-actors", "2", *args], stdout=subprocess.PIPE, text=True,
                  env={**CHILD_ENV, "LOCAL_RANK": str(rank)})


def listening_port(proc: subprocess.Popen) -> int:
    """The port a learner started with ``--port 0`` says it listens on (its first line of output)."""
    line = proc.stdout.readline()
    match = LISTENING.search(line)
    assert match, f"learner did not report its port: {line!r}"
    return int(match.group(1))


def started(command: list[str], what: str, **popen) -> tuple[subprocess.Popen, int]:
    """``command`` as a process (stdout piped, text) and the port its first line says it listens on; the
    process is killed and RuntimeError names ``what`` when that line says none."""
    proc = launch(command, stdout=subprocess.PIPE, text=True, **popen)
    line = proc.stdout.readline()
    match = LISTENING.search(line)
    if not match:
        proc.kill()
        raise RuntimeError(f"{what} did not report its port: {line!r}")
    return proc, int(match.group(1))


def start_relay(upstream_port: int, relay_id: str, *args: str, port: int = 0) -> tuple[subprocess.Popen, int]:
    """``actorlearner relay`` as a process; returns it and the port it printed."""
    return started([sys.executable, "-m", "actorlearner", "relay", "--upstream", f"127.0.0.1:{upstream_port}",
                    "--port", str(port), "--relay-id", relay_id, "--reconnect-max", "0.5", *args], "relay", env=CHILD_ENV)


def start_env_server(env: str, *args: str) -> tuple[subprocess.Popen, int]:
    """``actorlearner env-server --port 0`` in its own process; returns it and its port."""
    return started([sys.executable, "-m", "actorlearner", "env-server", "--env", env, "--port", "0", *args],
                   "env server", env=CHILD_ENV)
