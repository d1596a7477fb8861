"""The hand-written Node.js environment in examples/node-env against actorlearner.

Starts the real Node server and checks it with gymnasium's env checker through RemoteEnv,
checks its in-stream errors and session cap with raw stubs, and trains on it briefly.
Skipped only when `node` is not on PATH; missing node_modules are installed with `npm ci`.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from actorlearner import specs
from actorlearner.v1 import env_pb2 as pb
from actorlearner.v1 import env_pb2_grpc as pb_grpc

NODE_ENV = Path(__file__).resolve().parents[1] / "examples" / "node-env"
NODE = shutil.which("node")
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not on PATH: cannot run examples/node-env")


def start_server(*args: str) -> tuple[subprocess.Popen, int]:
    """``node server.js --port 0``; returns the process and the port it printed."""
    proc = subprocess.Popen([NODE, "server.js", "--port", "0", *args], cwd=NODE_ENV, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on [\d.]+:(\d+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"node env server did not report its port: {line!r}")
    return proc, int(match.group(1))


def stop_server(proc: subprocess.Popen) -> int:
    proc.terminate()
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@pytest.fixture(scope="module")
def installed() -> None:
    if not (NODE_ENV / "node_modules" / "@grpc" / "grpc-js").is_dir():
        npm = shutil.which("npm")
        assert npm, "node is on PATH but npm is not: install npm or run `npm ci` in examples/node-env"
        subprocess.run([npm, "ci", "--prefix", str(NODE_ENV)], check=True, timeout=300)


@pytest.fixture(scope="module")
def port(installed):
    proc, port = start_server()
    yield port
    assert stop_server(proc) == 0, "the node env server should exit 0 on SIGTERM"


class Session:
    """One raw Session stream: send a request, read its one response."""

    def __init__(self, stub: pb_grpc.EnvironmentStub):
        self.requests: queue.Queue = queue.Queue()
        self.responses = stub.Session(iter(self.requests.get, None), timeout=30)

    def send(self, **kind) -> pb.EnvResponse:
        self.requests.put(pb.EnvRequest(**kind))
        return next(self.responses)

    def reset(self, seed: int | None = None) -> pb.EnvResponse:
        return self.send(reset=pb.ResetRequest(seed=seed))

    def step(self, action, dtype: str = "int64") -> pb.EnvResponse:
        value = pb.Value(tensor=specs.tensor_to_proto(np.asarray(action, dtype=dtype)))
        return self.send(step=pb.StepRequest(action=value))

    def close(self) -> None:
        self.requests.put(None)
        self.responses.cancel()


@pytest.fixture
def stub(port):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.EnvironmentStub(channel)


def test_spec(stub):
    spec = stub.GetSpec(pb.GetSpecRequest(), timeout=10)
    obs, act = specs.space_from_proto(spec.observation_space), specs.space_from_proto(spec.action_space)
    assert obs.dtype == np.float32 and obs.shape == (6,) and np.isfinite(obs.low).all() and np.isfinite(obs.high).all()
    assert act.n == 4 and act.start == 0
    assert spec.max_episode_steps == 40


def test_check_env(port):
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from actorlearner.envs import RemoteEnv, make_env

    env = RemoteEnv(f"127.0.0.1:{port}")
    try:
        check_env(env, skip_render_check=True)
        low = np.array([0, 0, 0, 0, -1, -1], np.float32)
        assert env.observation_space == gym.spaces.Box(low, 1.0, (6,), np.float32)
        assert env.action_space == gym.spaces.Discrete(4)
    finally:
        env.close()
    env = make_env(f"grpc://127.0.0.1:{port}")
    try:
        obs, _ = env.reset(seed=3)
        assert obs in env.observation_space
    finally:
        env.close()


def test_seeded_reset_is_deterministic(stub):
    a, b = Session(stub), Session(stub)
    try:
        first, second = a.reset(seed=2**62 + 7), b.reset(seed=2**62 + 7)
        assert first.reset.observation == second.reset.observation
        for action in [0, 3, 1, 1, 2]:
            assert a.step(action).step == b.step(action).step
        # An unseeded reset continues the seeded stream.
        assert a.reset().reset.observation == b.reset().reset.observation
    finally:
        a.close()
        b.close()


def test_in_stream_errors(stub):
    session = Session(stub)
    try:
        reply = session.step(0)
        assert reply.WhichOneof("kind") == "error" and reply.error.code == FAILED_PRECONDITION
        assert session.reset(seed=1).WhichOneof("kind") == "reset"
        bad = [session.step(1, dtype="int32"), session.step([1]), session.step(4), session.send(step=pb.StepRequest()),
               session.send()]
        for reply in bad:
            assert reply.WhichOneof("kind") == "error" and reply.error.code == INVALID_ARGUMENT, reply
        assert "int64" in session.step(1, dtype="int32").error.message
        assert session.reset(seed=1).WhichOneof("kind") == "reset"
        assert session.step(1).WhichOneof("kind") == "step"
        # Walk until the episode ends, then step must wait for a reset.
        while not ((reply := session.step(0).step).terminated or reply.truncated):
            pass
        assert session.step(0).error.code == FAILED_PRECONDITION
        assert session.send(close=pb.CloseRequest()).WhichOneof("kind") == "close"
        assert list(session.responses) == []  # the server ends the stream after close
    finally:
        session.close()


def test_session_cap(installed):
    proc, port = start_server("--max-sessions", "1")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EnvironmentStub(channel)
            first = Session(stub)
            assert first.reset(seed=0).WhichOneof("kind") == "reset"
            second = Session(stub)
            with pytest.raises(grpc.RpcError) as refused:
                second.reset()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            first.close()  # a cancelled session frees its slot
            third = Session(stub)
            assert third.reset().WhichOneof("kind") == "reset"
            third.close()
    finally:
        assert stop_server(proc) == 0


def random_return(stub, episodes: int) -> float:
    """Mean return of a uniformly random policy."""
    rng = np.random.default_rng(0)
    session = Session(stub)
    total = 0.0
    try:
        for episode in range(episodes):
            session.reset(seed=episode)
            while True:
                reply = session.step(rng.integers(4)).step
                total += reply.reward
                if reply.terminated or reply.truncated:
                    break
    finally:
        session.close()
    return total / episodes


def test_training_run(port, stub, tmp_path):
    baseline = random_return(stub, 50)
    command = [sys.executable, "-m", "actorlearner", "run", "--env", f"grpc://127.0.0.1:{port}",
               "--actors", "1", "--num-envs", "2", "--max-seconds", "40", "--target-return", "100",
               "--min-replay-size", "256", "--eval-every", "5", "--eval-episodes", "20", "--eval-envs", "2",
               "--replay-capacity", "20000", "--batch-size", "64", "--publish-every", "5",
               "--dqn-hidden-sizes", "64,64", "--device", "cpu", "--run-dir", str(tmp_path)]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"run printed no result (exit {done.returncode}): {done.stdout[-2000:]!r}"
    result = json.loads(lines[-1])
    assert result["updates"] > 0 and result["policy_version"] > 0, result
    assert result["eval_return"] is not None and result["eval_return"] > baseline + 0.5, (result, baseline)
