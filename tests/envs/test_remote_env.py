"""Env servers and RemoteEnv: gymnasium's checker, seeds, session caps, vanished clients, bad requests."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import warnings

import grpc
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from procs import (
    CHILD_ENV,
    FAST_LEARNER,
    launch,
    loads_torch,
    start_actor,
    start_env_server,
    start_learner,
    status,
    status_if,
    stop,
    wait_until,
)

from actorlearner import specs
from actorlearner.envs import RemoteEnv, RemoteEnvError, make_env
from actorlearner.envs.server import serve
from actorlearner.v1 import env_pb2 as pb
from actorlearner.v1 import env_pb2_grpc as pb_grpc


def checker_warnings(env: gym.Env) -> set[str]:
    """The warnings gymnasium's check_env raises for ``env`` (it raises on real failures)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    return {str(w.message) for w in caught}


@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1", "custom_envs:dict_walk"])
def test_check_env_passes_through_a_real_env_server(name):
    server, port = start_env_server(name)
    try:
        remote = RemoteEnv(f"grpc://127.0.0.1:{port}")
        local = make_env(name).unwrapped
        try:
            assert specs.space_to_proto(remote.observation_space) == specs.space_to_proto(local.observation_space)
            assert specs.space_to_proto(remote.action_space) == specs.space_to_proto(local.action_space)
            # Whatever the checker says of the env itself, it says nothing more of it behind a server.
            assert checker_warnings(remote) <= checker_warnings(local)
            assert not loads_torch(server.pid), "an env server needs no torch"
        finally:
            remote.close()
            local.close()
    finally:
        assert stop(server) == [0]


@pytest.mark.parametrize("name", ["CartPole-v1", "custom_envs:dict_walk"])
def test_seeds_and_options_are_forwarded(name):
    with serve(lambda: make_env(name), name) as (_, port):
        remote, local = make_env(f"grpc://127.0.0.1:{port}"), make_env(name)
        try:
            for seed in (0, 7):
                got, want = remote.reset(seed=seed), local.reset(seed=seed)
                assert_same(got, want)
                remote.action_space.seed(seed)
                for _ in range(20):
                    action = remote.action_space.sample()
                    got, want = remote.step(action), local.step(action)
                    assert_same(got, want)
                    if got[2] or got[3]:
                        break
        finally:
            remote.close()
            local.close()


def assert_same(got, want):
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    else:
        np.testing.assert_array_equal(got, want)


def test_reset_options_reach_the_env():
    with serve(lambda: make_env("custom_envs:dict_walk"), "walk") as (_, port):
        env = RemoteEnv(f"127.0.0.1:{port}")
        obs, info = env.reset(seed=1, options={"start": np.array([2.0, -3.0])})
        np.testing.assert_array_equal(obs["position"], [2.0, -3.0])
        assert info["goal"].dtype == np.float32
        env.close()


def test_sessions_are_capped_and_freed():
    with serve(lambda: gym.make("CartPole-v1"), "CartPole-v1", max_sessions=2) as (service, port):
        first, second = RemoteEnv(f"127.0.0.1:{port}"), RemoteEnv(f"127.0.0.1:{port}")
        first.reset(seed=0), second.reset(seed=1)
        third = RemoteEnv(f"127.0.0.1:{port}")
        with pytest.raises(RemoteEnvError) as refused:
            third.reset()
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "cap of 2" in str(refused.value)
        third.close()
        first.close()
        wait_until(lambda: service.active == 1, 30, "the closed session's slot")
        fourth = RemoteEnv(f"127.0.0.1:{port}")
        fourth.reset(seed=2)
        fourth.step(0)
        second.step(1)
        fourth.close(), second.close()
        fourth.close()  # closing twice is allowed
        wait_until(lambda: service.active == 0, 30, "every slot back")


CLIENT = """
import sys
from actorlearner.envs import RemoteEnv
env = RemoteEnv(sys.argv[1])
env.reset(seed=0)
env.action_space.seed(0)  # five steps that do not reach the goal: the episode is still under way
for _ in range(5):
    env.step(env.action_space.sample())
print("mid-episode", flush=True)
sys.stdin.read()
"""


def test_a_client_killed_mid_episode_frees_its_session_and_the_server_goes_on():
    with serve(lambda: make_env("custom_envs:dict_walk"), "walk") as (service, port):
        survivor = RemoteEnv(f"127.0.0.1:{port}")
        survivor.reset(seed=3)
        survivor.action_space.seed(3)  # its five steps below do not end the episode either
        client = subprocess.Popen([sys.executable, "-c", CLIENT, f"127.0.0.1:{port}"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
        assert client.stdout.readline().strip() == "mid-episode"
        assert service.active == 2
        client.send_signal(signal.SIGKILL)
        client.wait()
        wait_until(lambda: service.active == 1, 30, "the killed client's session to be cleaned up")
        for _ in range(5):
            survivor.step(survivor.action_space.sample())
        fresh = RemoteEnv(f"127.0.0.1:{port}")
        fresh.reset(seed=4)
        fresh.close(), survivor.close()


def session(port: int):
    """A raw Session stream: ``send(request) -> response``, for requests RemoteEnv never sends."""
    requests: list = []
    cond = threading.Condition()

    def feed():
        sent = 0
        while True:
            with cond:
                cond.wait_for(lambda: len(requests) > sent)
                request = requests[sent]
            sent += 1
            if request is None:
                return
            yield request

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    responses = pb_grpc.EnvironmentStub(channel).Session(feed())

    def send(request):
        with cond:
            requests.append(request)
            cond.notify()
        return next(responses) if request is not None else None

    return send, channel


def error_of(response: pb.EnvResponse) -> tuple[grpc.StatusCode, str]:
    assert response.WhichOneof("kind") == "error", response
    code = next(c for c in grpc.StatusCode if c.value[0] == response.error.code)
    return code, response.error.message


def action(value, dtype="int64", shape=()):
    return pb.EnvRequest(step=pb.StepRequest(action=pb.Value(tensor=specs.tensor_to_proto(
        np.full(shape, value, dtype))))) if dtype else None


def test_bad_requests_get_in_stream_errors_while_other_sessions_run():
    with serve(lambda: gym.make("CartPole-v1"), "CartPole-v1") as (service, port):
        other = RemoteEnv(f"127.0.0.1:{port}")
        other.reset(seed=0)
        steps, stop_other = [0], threading.Event()

        def keep_stepping():
            while not stop_other.is_set():
                if any(other.step(other.action_space.sample())[2:4]):
                    other.reset()
                steps[0] += 1

        runner = threading.Thread(target=keep_stepping)
        runner.start()
        send, channel = session(port)
        try:
            code, message = error_of(send(action(0)))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "reset" in message
            code, message = error_of(send(pb.EnvRequest()))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "no kind" in message
            assert send(pb.EnvRequest(reset=pb.ResetRequest(seed=5))).WhichOneof("kind") == "reset"
            garbage = pb.EnvRequest(step=pb.StepRequest(action=pb.Value(tensor=pb.Tensor(
                dtype="int64", shape=[], data=b"\x01\x02\x03"))))
            code, message = error_of(send(garbage))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs 8 bytes" in message
            code, message = error_of(send(pb.EnvRequest(step=pb.StepRequest(action=pb.Value(tensor=pb.Tensor(
                dtype="complex128", shape=[], data=b"\0" * 16))))))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown dtype" in message
            code, message = error_of(send(action(7)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "not in Discrete(2)" in message
            code, message = error_of(send(action(1, "float32", (3,))))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            # The session survived all of it: the episode goes on where it was.
            step = send(action(1)).step
            assert len(step.observation.tensor.data) == 16 and step.reward == 1.0
            assert send(pb.EnvRequest(close=pb.CloseRequest())).WhichOneof("kind") == "close"
            before = steps[0]
            wait_until(lambda: steps[0] > before, 30, "the other session to keep stepping")
        finally:
            send(None)
            channel.close()
            stop_other.set()
            runner.join(30)
        other.close()
        wait_until(lambda: service.active == 0, 30, "both sessions closed")


def test_an_env_that_raises_is_an_internal_error_and_the_session_goes_on():
    with serve(lambda: make_env("custom_envs:failing"), "failing") as (_, port):
        env = RemoteEnv(f"127.0.0.1:{port}")
        env.reset(seed=0)
        with pytest.raises(RemoteEnvError, match="diagonal moves are broken") as failed:
            env.step(np.array([1, 1]))
        assert failed.value.code == grpc.StatusCode.INTERNAL
        with pytest.raises(RemoteEnvError) as not_reset:
            env.step(np.array([0, 1]))
        assert not_reset.value.code == grpc.StatusCode.FAILED_PRECONDITION
        env.reset(seed=1)
        env.step(np.array([0, 1]))
        env.close()


def test_env_names():
    assert isinstance(make_env("custom_envs:dict_walk").unwrapped, gym.Env)
    with pytest.raises(ValueError, match="not a gymnasium.Env"):
        make_env("custom_envs:not_an_env")
    with pytest.raises(ValueError, match="cannot import"):
        make_env("no_such_package.module:make")
    with pytest.raises(ValueError, match="NoSuchEnv-v0"):
        make_env("NoSuchEnv-v0")
    with pytest.raises(RemoteEnvError, match="UNAVAILABLE|DEADLINE_EXCEEDED"):
        RemoteEnv("grpc://127.0.0.1:1", timeout=1)
    with pytest.raises(ValueError, match="not grpc://"):
        subprocess_run_env_server("grpc://127.0.0.1:1")


def subprocess_run_env_server(env: str):
    done = subprocess.run([sys.executable, "-m", "actorlearner", "env-server", "--env", env],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    raise ValueError(done.stderr)


def test_two_actors_train_through_env_servers():
    servers = [start_env_server("CartPole-v1") for _ in range(2)]
    learner, port = start_learner(*FAST_LEARNER, "--env", f"grpc://127.0.0.1:{servers[0][1]}")
    actors = [start_actor(port, f"remote-{i}", "--env", f"grpc://127.0.0.1:{server_port}", "--seed", str(i))
              for i, (_, server_port) in enumerate(servers)]
    try:
        wait_until(lambda: (s := status(port)).policy_version >= 3
                   and len([a for a in s.actors if a.policy_version >= 1]) == 2, 90,
                   "training on both actors' remote envs")
        final = status(port)
        assert final.buffer_size >= 256 and final.updates > 0
    finally:
        codes = stop(*actors, learner, *(proc for proc, _ in servers))
    assert codes == [0] * 5, f"exit codes actors/learner/env servers: {codes}"


def test_run_trains_on_a_grpc_env(tmp_path):
    """``run`` with a ``grpc://`` env: its actor and its evaluator play through the env server, and it trains."""
    server, port = start_env_server("CartPole-v1")
    with open(tmp_path / "stderr.txt", "w") as stderr:
        # A sync-mode actor: the point is the env behind a server, not the vector mode (auto would spawn the
        # actor's env loop as a process of its own, one more torch start and busy core).
        run = launch([sys.executable, "-m", "actorlearner", "run", "--port", "0", *FAST_LEARNER,
                      "--env", f"grpc://127.0.0.1:{port}", "--actors", "1", "--num-envs", "2", "--vector-mode", "sync",
                      "--max-seconds", "600", "--eval-every", "2", "--eval-episodes", "2", "--eval-envs", "2",
                      "--no-plot", "--run-dir", str(tmp_path / "run")],
                     stdout=subprocess.PIPE, stderr=stderr, text=True, env=CHILD_ENV)
    try:
        learner_port = int(run.stdout.readline().rsplit(":", 1)[1])
        wait_until(lambda: status_if(learner_port, lambda s: s.updates > 0 and s.evaluations > 0), 120,
                   "updates and an evaluation")
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=120)
    finally:
        codes = stop(run, server)
    assert codes == [1, 0], (tmp_path / "stderr.txt").read_text()[-3000:]  # 1: stopped before solving
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ended"] == "stopped" and result["updates"] > 0 and result["policy_version"] > 0, result
    assert result["eval_return"] is not None, result
