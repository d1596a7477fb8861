"""Multi-agent envs over env.proto: the spec, RemoteMultiAgentEnv against the env itself, hostile
sessions, the env-server CLI with tic-tac-toe, and make_env / make_vector_env with several agents."""

from __future__ import annotations

import grpc
import gymnasium as gym
import numpy as np
import pytest
from multiagent_envs import Expedition, x_against_random
from procs import start_env_server, stop, wait_until
from test_remote_env import error_of, session

from actorlearner import specs
from actorlearner.envs import RemoteEnv, RemoteEnvError, RemoteMultiAgentEnv, make_env, make_vector_env
from actorlearner.envs.multiagent import acting
from actorlearner.envs.server import serve
from actorlearner.envs.tictactoe import TicTacToe
from actorlearner.transport import SecurityConfig
from actorlearner.v1 import env_pb2 as pb
from actorlearner.v1 import env_pb2_grpc as pb_grpc

EXPEDITION = "multiagent_envs:expedition"
TIC_TAC_TOE = "actorlearner.envs.tictactoe:tic_tac_toe"
INVALID, PRECONDITION = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION


def assert_same(got, want, path="value"):
    """Equal structure, keys, types and values; arrays and numbers also equal in dtype and shape."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{path}: {got!r} != {want!r}"
        for key in want:
            assert_same(got[key], want[key], f"{path}/{key}")
    elif isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}/{i}")
    elif isinstance(want, str):
        assert got == want, f"{path}: {got!r} != {want!r}"
    else:
        g, w = np.asarray(got), np.asarray(want)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{path}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=path)


def play_both(remote, local, seeds, choose):
    """Play ``remote`` and ``local`` side by side, seeded episodes, the same actions (``choose(agent,
    observation, rng)``); every reset and step must agree. Returns what happened, per step."""
    events = []
    rng = np.random.default_rng(0)
    for seed in seeds:
        got, want = remote.reset(seed=seed), local.reset(seed=seed)
        assert_same(got, want, f"reset {seed}")
        assert remote.agents == local.agents
        observations, terminations, truncations = want[0], {}, {}
        while local.agents:
            actions = {agent: choose(agent, observations[agent], rng)
                       for agent in acting(observations, terminations, truncations)}
            got, want = remote.step(actions), local.step(actions)
            assert_same(got, want, f"seed {seed} step {len(events)}")
            assert remote.agents == local.agents
            observations, _, terminations, truncations, _ = want
            events.append((set(actions), want, list(local.agents)))
    return events


def test_the_spec_lists_every_agent_with_its_spaces():
    with serve(lambda: make_env(EXPEDITION), "expedition") as (_, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        spec = pb_grpc.EnvironmentStub(channel).GetSpec(pb.GetSpecRequest(), timeout=10)
    local = Expedition()
    assert [a.name for a in spec.agents] == local.possible_agents
    for agent in spec.agents:
        assert specs.space_from_proto(agent.observation_space) == local.observation_space(agent.name)
        assert specs.space_from_proto(agent.action_space) == local.action_space(agent.name)
    assert not spec.HasField("observation_space") and not spec.HasField("action_space")
    assert spec.env_id == "expedition" and spec.max_episode_steps == Expedition.max_episode_steps


def test_every_per_agent_field_round_trips_including_an_agent_that_leaves():
    with serve(lambda: make_env(EXPEDITION), "expedition") as (_, port):
        remote, local = make_env(f"grpc://127.0.0.1:{port}"), Expedition()
        try:
            assert isinstance(remote, RemoteMultiAgentEnv) and remote.possible_agents == local.possible_agents
            for agent in local.possible_agents:
                assert remote.observation_space(agent) == local.observation_space(agent)
                assert remote.action_space(agent) == local.action_space(agent)
                remote.action_space(agent).seed(1)
            events = play_both(remote, local, [0, 1, 2, 3, 2**40 + 5],
                               lambda agent, obs, rng: remote.action_space(agent).sample())
            got, want = remote.reset(seed=9, options={"level": 0.5}), local.reset(seed=9, options={"level": 0.5})
            assert_same(got, want, "reset with options")
            assert got[0]["base"][1, 0] == np.float32(0.5)
        finally:
            remote.close()
            remote.close()  # closing twice is allowed
    # What the five episodes held: in each, the scout left while the others went on, without it,
    # until both were truncated. The base was rewarded in steps it did not act in, and in steps
    # that did not observe it (no observation in its AgentStep).
    left = [i for i, (_, want, live) in enumerate(events) if want[2].get("scout") and live == ["relay", "base"]]
    assert len(left) == 5
    for i in left:
        actions, want, _ = events[i + 1]
        assert "scout" not in actions and all("scout" not in field for field in want)
    endings = [want for _, want, live in events if not live]
    assert len(endings) == 5 and all(want[3] == {"relay": True, "base": True} for want in endings)
    assert any(want[1]["base"] > 0 for actions, want, _ in events if "base" not in actions)
    assert any(want[1]["base"] > 0 for _, want, live in events if "base" in live and "base" not in want[0])


def test_a_multi_agent_server_needs_the_multi_agent_client_and_vice_versa():
    with serve(lambda: make_env(EXPEDITION), "expedition") as (service, port):
        with pytest.raises(ValueError, match="multi-agent env.*'scout'.*use RemoteMultiAgentEnv"):
            RemoteEnv(f"grpc://127.0.0.1:{port}")
        assert service.sessions_total == 0  # refused before a session opened
    with serve(lambda: gym.make("CartPole-v1"), "CartPole-v1") as (_, port):
        with pytest.raises(ValueError, match="single-agent env.*use RemoteEnv"):
            RemoteMultiAgentEnv(f"grpc://127.0.0.1:{port}")
        remote = make_env(f"grpc://127.0.0.1:{port}")
        assert isinstance(remote, RemoteEnv)
        remote.close()


def test_a_token_secures_a_multi_agent_server_as_any_other():
    secured = SecurityConfig(auth_token="multi-agent-token")
    with serve(lambda: make_env(TIC_TAC_TOE), "ttt", security=secured) as (service, port):
        for stranger in (None, SecurityConfig(auth_token="wrong")):
            with pytest.raises(RemoteEnvError) as refused:
                RemoteMultiAgentEnv(f"127.0.0.1:{port}", timeout=5, security=stranger)
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        env = make_env(f"grpc://127.0.0.1:{port}", secured)
        observations, _ = env.reset(seed=0)
        assert list(observations) == ["x"] and "o" in env.step({"x": 4})[0]
        env.close()
        wait_until(lambda: service.active == 0, 30, "the session closed")


def agent_action(agent: str, value, dtype="int64") -> pb.AgentAction:
    return pb.AgentAction(agent=agent, action=pb.Value(tensor=specs.tensor_to_proto(np.asarray(value, dtype))))


def step_of(*actions: pb.AgentAction) -> pb.EnvRequest:
    return pb.EnvRequest(step=pb.StepRequest(actions=actions))


def test_hostile_steps_are_refused_and_leave_the_episode_as_it_was():
    valid = [step_of(agent_action("scout", [1, 0]), agent_action("relay", 2), agent_action("base", 1)),
             step_of(agent_action("scout", [0, -1]), agent_action("relay", 1))]  # base does not act on odd steps
    reset = pb.EnvRequest(reset=pb.ResetRequest(seed=4))
    with serve(lambda: make_env(EXPEDITION), "expedition") as (service, port):
        send, channel = session(port)
        twin, twin_channel = session(port)  # gets only the valid requests
        try:
            code, message = error_of(send(valid[0]))
            assert code == PRECONDITION and "reset" in message
            assert send(reset).reset == twin(reset).reset
            refused = {
                "unknown agent 'pilot'": step_of(*valid[0].step.actions, agent_action("pilot", 0)),
                "'relay' has two actions": step_of(*valid[0].step.actions, agent_action("relay", 0)),
                "no action for acting agents ['base']": step_of(*valid[0].step.actions[:2]),
                "of agent 'base' is not in Discrete(2, start=1)": step_of(*valid[0].step.actions[:2],
                                                                         agent_action("base", 0)),
                "of agent 'scout' is not in MultiDiscrete": step_of(agent_action("scout", [2, 0]),
                                                                    *valid[0].step.actions[1:]),
                "several agents: a step carries actions": pb.EnvRequest(step=pb.StepRequest(
                    action=pb.Value(tensor=specs.tensor_to_proto(np.int64(1))))),
                "needs 8 bytes": step_of(*valid[0].step.actions[:2], pb.AgentAction(agent="base", action=pb.Value(
                    tensor=pb.Tensor(dtype="int64", data=b"\x01")))),
            }
            for expected, request in refused.items():
                code, message = error_of(send(request))
                assert code == INVALID and expected in message, (expected, message)
            assert send(valid[0]).step == twin(valid[0]).step
            code, message = error_of(send(valid[0]))  # base is not to act on odd steps
            assert code == INVALID and "agent 'base' is not to act now" in message
            response = send(valid[1])
            assert response.step == twin(valid[1]).step
            # Play the episode out: every agent leaves, and step needs a reset again.
            while response.step.live_agents:
                observed = [s.agent for s in response.step.agents
                            if s.HasField("observation") and s.agent in response.step.live_agents]
                step = step_of(*[a for a in valid[0].step.actions if a.agent in observed])
                response = send(step)
                assert response.WhichOneof("kind") == "step" and response == twin(step)
            code, message = error_of(send(step))
            assert code == PRECONDITION and "reset" in message
            assert send(reset).reset == twin(reset).reset
            assert send(valid[0]).step == twin(valid[0]).step
        finally:
            send(None), twin(None)
            channel.close(), twin_channel.close()
        wait_until(lambda: service.active == 0, 30, "both sessions closed")


def test_an_env_that_raises_is_internal_and_needs_a_reset():
    with serve(lambda: make_env("multiagent_envs:failing_expedition"), "failing") as (_, port):
        env = RemoteMultiAgentEnv(f"127.0.0.1:{port}")
        try:
            env.reset(seed=0)
            with pytest.raises(RemoteEnvError, match="cannot move diagonally") as failed:
                env.step({"scout": np.array([1, 1]), "relay": 0, "base": 1})
            assert failed.value.code == grpc.StatusCode.INTERNAL
            with pytest.raises(RemoteEnvError) as not_reset:
                env.step({"scout": np.array([0, 1]), "relay": 0, "base": 1})
            assert not_reset.value.code == PRECONDITION
            env.reset(seed=1)
            assert "relay" in env.step({"scout": np.array([0, 1]), "relay": 0, "base": 1})[0]
        finally:
            env.close()


def test_tic_tac_toe_through_the_env_server_cli():
    server, port = start_env_server(TIC_TAC_TOE)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            spec = pb_grpc.EnvironmentStub(channel).GetSpec(pb.GetSpecRequest(), timeout=10)
        assert spec.env_id == TIC_TAC_TOE and spec.max_episode_steps == 0
        assert [a.name for a in spec.agents] == ["x", "o"]
        remote, local = make_env(f"grpc://127.0.0.1:{port}"), TicTacToe()
        try:
            def choose(agent, observation, rng):  # mostly legal moves, now and then a taken cell
                empty = np.flatnonzero(observation["action_mask"])
                return np.int64(rng.integers(9) if rng.random() < 0.1 else rng.choice(empty))

            events = play_both(remote, local, range(12), choose)
        finally:
            remote.close()
    finally:
        assert stop(server) == [0]
    assert all(len(actions) == 1 for actions, *_ in events)  # turn-based: one mover a step
    endings = [want for _, want, agents in events if not agents]
    assert len(endings) == 12 and {tuple(sorted(w[4]["x"])) for w in endings} >= {("winner",)}


def test_make_env_and_make_vector_env_with_several_agents():
    assert isinstance(make_env(EXPEDITION), Expedition)
    with pytest.raises(ValueError, match="no possible_agents"):
        make_env("multiagent_envs:no_agents")
    with pytest.raises(ValueError, match="cannot render 'rgb_array'.*multi-agent"):
        make_env(TIC_TAC_TOE, render_mode="rgb_array")
    with pytest.raises(ValueError, match="multi-agent env trains by self-play"):
        make_vector_env(TIC_TAC_TOE, 2)
    with serve(lambda: make_env(TIC_TAC_TOE), "ttt") as (service, port):
        with pytest.raises(ValueError, match="cannot render"):
            make_env(f"grpc://127.0.0.1:{port}", render_mode="rgb_array")
        with pytest.raises(ValueError, match="'x', 'o'.*trains by self-play"):
            make_vector_env(f"grpc://127.0.0.1:{port}", 2)
        wait_until(lambda: service.active == 0, 30, "the refused env's session closed")
        envs = make_vector_env(f"grpc://127.0.0.1:{port}", 2, wrap=x_against_random)
        try:
            observations, _ = envs.reset(seed=0)
            assert observations["observation"].shape == (2, 27)
            wait_until(lambda: service.active == 2, 30, "two sessions, the probe's closed")
            for _ in range(20):
                observations, *_ = envs.step(envs.action_space.sample())
            assert observations["observation"].shape == (2, 27)
        finally:
            envs.close()
    def zeroed(env):  # a wrap applies to single-agent envs too
        return gym.wrappers.TransformObservation(env, np.zeros_like, env.observation_space)

    envs = make_vector_env("CartPole-v1", 2, wrap=zeroed)
    try:
        assert not envs.reset(seed=0)[0].any() and not envs.step(np.zeros(2, np.int64))[0].any()
    finally:
        envs.close()
