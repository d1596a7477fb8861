"""The hand-written Node.js environments in examples/node-env against actorlearner.

Starts the real Node server and checks it with gymnasium's env checker through RemoteEnv,
checks its in-stream errors and session cap with raw stubs, and trains on it briefly. Plays
the two-player duel.js through RemoteMultiAgentEnv beside its Python twin, field by field,
and checks its in-stream errors.
Skipped only when `node` is not on PATH; missing node_modules are installed with `npm ci`.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from multiagent_envs import Duel
from procs import run_command, started
from test_multiagent_env import play_both

from actorlearner import specs
from actorlearner.v1 import env_pb2 as pb
from actorlearner.v1 import env_pb2_grpc as pb_grpc

NODE_ENV = Path(__file__).resolve().parents[2] / "examples" / "node-env"
NODE = shutil.which("node")
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not on PATH: cannot run examples/node-env")


def start_server(*args: str, script: str = "server.js") -> tuple[subprocess.Popen, int]:
    """``node SCRIPT --port 0``; returns the process and the port it printed."""
    return started([NODE, script, "--port", "0", *args], "node env server", cwd=NODE_ENV)


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
    command = [sys.executable, "-m", "actorlearner", "run", "--port", "0", "--vector-mode", "sync",
               "--env", f"grpc://127.0.0.1:{port}",
               "--actors", "1", "--num-envs", "2", "--max-seconds", "240", "--target-return", str(baseline + 1.0),
               "--min-replay-size", "256", "--eval-every", "5", "--eval-episodes", "20", "--eval-envs", "2",
               "--replay-capacity", "20000", "--batch-size", "64", "--publish-every", "5",
               "--dqn-hidden-sizes", "64,64", "--device", "cpu", "--run-dir", str(tmp_path)]
    done = run_command(command, timeout=360)  # ends when solved
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"run printed no result (exit {done.returncode}): {done.stdout[-2000:]!r}"
    result = json.loads(lines[-1])
    assert result["updates"] > 0 and result["policy_version"] > 0, result
    assert result["eval_return"] is not None and result["eval_return"] > baseline + 0.5, (result, baseline)


# ---------------------------------------------------------------------------------
# duel.js: two players, one of whom may leave while the other runs on.
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def duel_port(installed):
    proc, port = start_server(script="duel.js")
    yield port
    assert stop_server(proc) == 0, "the node duel server should exit 0 on SIGTERM"


def test_duel_spec(duel_port):
    with grpc.insecure_channel(f"127.0.0.1:{duel_port}") as channel:
        spec = pb_grpc.EnvironmentStub(channel).GetSpec(pb.GetSpecRequest(), timeout=10)
    twin = Duel()
    assert spec.env_id == "node-duel-v0" and spec.max_episode_steps == Duel.MAX_STEPS
    assert [a.name for a in spec.agents] == twin.possible_agents
    assert not spec.HasField("observation_space") and not spec.HasField("action_space")
    for agent in spec.agents:
        assert specs.space_from_proto(agent.observation_space) == twin.observation_space(agent.name)
        assert specs.space_from_proto(agent.action_space) == twin.action_space(agent.name)


def toward_beacon(greed: dict[str, float]):
    """A runner's move: the step toward its beacon with probability ``greed[runner]``, else random."""
    def choose(agent, observation, rng):
        if rng.random() >= greed[agent]:
            return np.int64(rng.integers(4))
        dx, dy = observation[2] - observation[0], observation[3] - observation[1]
        return np.int64(1 if dx > 0 else 0 if dx < 0 else 3 if dy > 0 else 2)
    return choose


def test_duel_round_trips_every_per_agent_field_including_a_runner_that_leaves(duel_port):
    from actorlearner.envs import RemoteMultiAgentEnv, make_env

    remote, twin = make_env(f"grpc://127.0.0.1:{duel_port}"), Duel()
    try:
        assert isinstance(remote, RemoteMultiAgentEnv) and remote.possible_agents == ["red", "blue"]
        events = play_both(remote, twin, [0, 1, 2, 3, 4, 5, 2**62 + 7, 2**63 - 1],
                           toward_beacon({"red": 0.9, "blue": 0.2}))
        observations, infos = remote.reset()  # unseeded: the server's own stream
        assert set(observations) == set(infos) == set(remote.agents) == {"red", "blue"}
    finally:
        remote.close()
    # A runner arrived while the other ran on, alone, in a later step; episodes ended by
    # arrival and by the time limit.
    alone = [i for i, (_, want, live) in enumerate(events) if len(live) == 1 and len(want[0]) == 2]
    assert alone, "no episode where one runner left before the other"
    for i in alone:
        (leaver,) = [agent for agent, done in events[i][1][2].items() if done]
        actions, want, _ = events[i + 1]
        assert leaver not in actions and all(leaver not in field for field in want)
        assert events[i][1][4][leaver]["result"] == "first" and events[i][1][1][leaver] == 1.0
    ends = [want for _, want, live in events if not live]
    assert any(any(want[2].values()) for want in ends) and any(any(want[3].values()) for want in ends)


def test_duel_in_stream_errors(duel_port):
    def act(agent: str, value, dtype: str = "int64") -> pb.AgentAction:
        return pb.AgentAction(agent=agent, action=pb.Value(tensor=specs.tensor_to_proto(np.asarray(value, dtype))))

    with grpc.insecure_channel(f"127.0.0.1:{duel_port}") as channel:
        stub = pb_grpc.EnvironmentStub(channel)
        session, twin = Session(stub), Session(stub)
        both = [act("red", 1), act("blue", 2)]
        try:
            assert session.send(step=pb.StepRequest(actions=both)).error.code == FAILED_PRECONDITION
            body = session.reset(seed=11).reset
            assert body == twin.reset(seed=11).reset
            bad = {
                "unknown agent": [*both, act("green", 0)],
                "two actions": [*both, act("red", 0)],
                "no action for acting agents blue": both[:1],
                "outside the action space": [act("red", 4), both[1]],
                "int64": [act("red", 1, "int32"), both[1]],
            }
            for expected, actions in bad.items():
                reply = session.send(step=pb.StepRequest(actions=actions))
                assert reply.error.code == INVALID_ARGUMENT and expected in reply.error.message, (expected, reply)
            reply = session.step(1)  # a single-agent step
            assert reply.error.code == INVALID_ARGUMENT and "several agents" in reply.error.message
            # Refused steps changed nothing: the session plays on exactly as its twin until a
            # runner leaves.
            choose, rng, live = toward_beacon({"red": 1.0, "blue": 0.2}), np.random.default_rng(0), ["red", "blue"]
            while live == ["red", "blue"]:
                request = pb.StepRequest(actions=[act(s.agent, choose(s.agent, np.frombuffer(
                    s.observation.tensor.data, "<f4"), rng)) for s in body.agents])
                reply = session.send(step=request)
                assert reply == twin.send(step=request)
                body, live = reply.step, list(reply.step.live_agents)
            assert len(live) == 1, "both runners left in the same step: pick another seed"
            (gone,) = {"red", "blue"} - set(live)
            reply = session.send(step=pb.StepRequest(actions=both))
            assert reply.error.code == INVALID_ARGUMENT and f'agent "{gone}" is not to act now' in reply.error.message
            alone = [a for a in both if a.agent in live]
            for _ in range(Duel.MAX_STEPS):  # the other runs on alone until it leaves too; then step is refused
                reply = session.send(step=pb.StepRequest(actions=alone))
                if reply.WhichOneof("kind") == "error":
                    break
                assert list(reply.step.live_agents) in (live, [])
            assert reply.error.code == FAILED_PRECONDITION and "reset" in reply.error.message
            assert session.reset(seed=3).WhichOneof("kind") == "reset"
        finally:
            session.close()
            twin.close()
