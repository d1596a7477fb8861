"""The env server: any environment behind env.proto's ``Environment`` service, one instance per session.

A factory may make gymnasium envs or multi-agent envs (:mod:`actorlearner.envs.multiagent`);
the spec and the sessions follow the kind of env it makes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import gymnasium as gym
from google.protobuf.message import DecodeError

from actorlearner import specs, wire
from actorlearner.envs.multiagent import MultiAgentEnv, acting, check_agents, is_multi_agent
from actorlearner.envs.steps import StepFormat
from actorlearner.health import Health
from actorlearner.metrics import Metric
from actorlearner.transport import SecurityConfig, add_port, auth_interceptors, grpc_options
from actorlearner.v1 import env_pb2 as pb
from actorlearner.values import dict_from_proto, value_from_proto, value_to_proto

logger = logging.getLogger(__name__)


class SessionError(Exception):
    """A request that failed; answered in the stream with ``code``, the session stays open."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class SessionBase:
    """One client's environment: answers requests in order and enforces the call order.

    Requests and responses are serialized bytes. Subclasses answer ``reset`` and ``step``
    for their kind of env.
    """

    def __init__(self, env, max_bytes: int):
        self.env = env
        self.max_bytes = max_bytes
        self.ready = False  # True between a reset and the end of the episode
        self.closed = False
        self.steps_done = 0

    def handle(self, raw: bytes) -> bytes:
        """The serialized response to one serialized request; failures become an in-stream error."""
        try:
            fast = self._fast_step(raw)
            if fast is not None:
                return fast
            try:
                request = pb.EnvRequest.FromString(raw)
            except DecodeError:
                raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, "request is not an EnvRequest message") from None
            kind = request.WhichOneof("kind")
            if kind == "step":
                if not self.ready:
                    raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                                       "step needs a reset first (at the start and after every episode end)")
                return self._step(request.step)
            if kind == "reset":
                seed = request.reset.seed if request.reset.HasField("seed") else None
                options = dict_from_proto(request.reset.options, self.max_bytes) or None
                self.ready = False
                return self._reset(seed, options)
            if kind == "close":
                self.closed = True
                return pb.EnvResponse(close=pb.CloseResponse()).SerializeToString()
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, "request has no kind set (reset, step or close)")
        except SessionError as exc:
            return error_response(exc.code, str(exc))
        except wire.WireError as exc:
            return error_response(exc.status_code, f"malformed request: {exc}")

    def _fast_step(self, raw: bytes) -> bytes | None:
        """The response to a step request recognized without parsing it; None to parse it."""
        return None

    def _reset(self, seed: int | None, options: dict | None) -> bytes:
        raise NotImplementedError

    def _step(self, request: pb.StepRequest) -> bytes:
        raise NotImplementedError

    def _call(self, method: str, *args, **kwargs):
        """Call the env; an exception it raises is the client's INTERNAL error, and the episode is over."""
        try:
            return getattr(self.env, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure of user code goes back to the client
            self.ready = False
            logger.warning("env %s raised: %r", method, exc)
            raise SessionError(grpc.StatusCode.INTERNAL, f"env {method} raised {type(exc).__name__}: {exc}") from None


class EnvSession(SessionBase):
    """A gymnasium env's session: canonical step messages take the :class:`StepFormat` path,
    everything else is parsed and built as protobuf messages."""

    def __init__(self, env: gym.Env, max_bytes: int):
        super().__init__(env, max_bytes)
        self.steps = StepFormat(env.observation_space, env.action_space)

    def _fast_step(self, raw: bytes) -> bytes | None:
        if self.ready and (action := self.steps.decode_request(raw)) is not None:
            return self._take(action)
        return None

    def _step(self, request: pb.StepRequest) -> bytes:
        return self._take(self._action(request))

    def _action(self, request: pb.StepRequest):
        if request.actions:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                               "this env has a single agent: a step carries action, not actions")
        space = self.env.action_space
        action = value_from_proto(request.action, space, self.max_bytes)
        if not _contains(space, action):
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, f"action {action!r:.200} is not in {space}")
        return action

    def _reset(self, seed: int | None, options: dict | None) -> bytes:
        obs, info = self._call("reset", seed=seed, options=options)
        self.ready = True
        return pb.EnvResponse(reset=pb.ResetResponse(observation=value_to_proto(obs),
                                                     info=info_to_proto(info))).SerializeToString()

    def _take(self, action) -> bytes:
        obs, reward, terminated, truncated, info = self._call("step", action)
        self.steps_done += 1
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        self.ready = not (terminated or truncated)
        if not info and (fast := self.steps.encode_response(obs, reward, terminated, truncated)) is not None:
            return fast
        return pb.EnvResponse(step=pb.StepResponse(
            observation=value_to_proto(obs), reward=reward, terminated=terminated, truncated=truncated,
            info=info_to_proto(info))).SerializeToString()


class MultiAgentSession(SessionBase):
    """A multi-agent env's session: each step takes actions from exactly the agents that act next.

    The episode lasts while the env has live ``agents``; a step the session refuses leaves
    the env untouched.
    """

    def __init__(self, env: MultiAgentEnv, max_bytes: int):
        super().__init__(env, max_bytes)
        self.action_spaces = {agent: env.action_space(agent) for agent in env.possible_agents}
        self.acting: list[str] = []  # the agents the next step takes actions from

    def _reset(self, seed: int | None, options: dict | None) -> bytes:
        observations, infos = self._call("reset", seed=seed, options=options)
        self.acting = acting(observations)
        self.ready = bool(self.env.agents)
        return pb.EnvResponse(reset=pb.ResetResponse(agents=agent_steps(observations, {}, {}, {}, infos),
                                                     live_agents=self.env.agents)).SerializeToString()

    def _step(self, request: pb.StepRequest) -> bytes:
        observations, rewards, terminations, truncations, infos = self._call("step", self._actions(request))
        self.steps_done += 1
        self.acting = acting(observations, terminations, truncations)
        self.ready = bool(self.env.agents)
        return pb.EnvResponse(step=pb.StepResponse(
            agents=agent_steps(observations, rewards, terminations, truncations, infos),
            live_agents=self.env.agents)).SerializeToString()

    def _actions(self, request: pb.StepRequest) -> dict:
        """The request's actions by agent, in its order: exactly one, in its space, per acting agent."""
        def refuse(message: str):
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, message)

        if request.HasField("action"):
            refuse("this env has several agents: a step carries actions (one per acting agent), not action")
        actions = {}
        for item in request.actions:
            agent = item.agent
            if agent in actions:
                refuse(f"agent {agent!r} has two actions in one step")
            if agent not in self.action_spaces:
                refuse(f"unknown agent {agent!r}: the env's agents are {list(self.action_spaces)}")
            if agent not in self.acting:
                refuse(f"agent {agent!r} is not to act now: the acting agents are {self.acting}")
            space = self.action_spaces[agent]
            action = value_from_proto(item.action, space, self.max_bytes)
            if not _contains(space, action):
                refuse(f"action {action!r:.200} of agent {agent!r} is not in {space}")
            actions[agent] = action
        missing = [agent for agent in self.acting if agent not in actions]
        if missing:
            refuse(f"no action for acting agents {missing}: a step takes one from each of {self.acting}")
        return actions


def agent_steps(observations: dict, rewards: dict, terminations: dict, truncations: dict,
                infos: dict) -> list[pb.AgentStep]:
    """One AgentStep per agent named in any of the dicts, in order of first mention."""
    steps = []
    for agent in dict.fromkeys([*observations, *rewards, *terminations, *truncations, *infos]):
        step = pb.AgentStep(agent=agent, reward=float(rewards.get(agent, 0.0)),
                            terminated=bool(terminations.get(agent, False)),
                            truncated=bool(truncations.get(agent, False)))
        if agent in observations:
            step.observation.CopyFrom(value_to_proto(observations[agent]))
        if agent in infos:
            step.info.CopyFrom(info_to_proto(infos[agent]))
        steps.append(step)
    return steps


def _contains(space: gym.Space, value) -> bool:
    """``space.contains(value)``; False where gymnasium raises on a value of the wrong structure."""
    try:
        return bool(space.contains(value))
    except Exception:  # noqa: BLE001 - e.g. MultiDiscrete.contains on a ragged tuple raises ValueError
        return False


def error_response(code: grpc.StatusCode, message: str) -> bytes:
    return pb.EnvResponse(error=pb.Status(code=code.value[0], message=message)).SerializeToString()


def info_to_proto(info: dict) -> pb.DictValue:
    """An info dict as a DictValue; a value that cannot travel goes as its repr, text."""
    entries = []
    for key, value in info.items():
        try:
            message = value_to_proto(value)
        except ValueError:
            message = pb.Value(text=repr(value))
        entries.append(pb.DictValue.Entry(key=str(key), value=message))
    return pb.DictValue(entries=entries)


def environment_spec(env: gym.Env | MultiAgentEnv, env_id: str) -> pb.EnvironmentSpec:
    """The spec of ``env``: its spaces, or each agent's for a multi-agent env.

    ``max_episode_steps`` is gymnasium's ``env.spec.max_episode_steps``; a multi-agent env
    states it as a ``max_episode_steps`` attribute (absent: unknown or unbounded, 0).
    """
    if is_multi_agent(env):
        check_agents(env)
        agents = [pb.AgentSpec(name=agent, observation_space=specs.space_to_proto(env.observation_space(agent)),
                               action_space=specs.space_to_proto(env.action_space(agent)))
                  for agent in env.possible_agents]
        return pb.EnvironmentSpec(env_id=env_id, agents=agents,
                                  max_episode_steps=getattr(env, "max_episode_steps", None) or 0)
    max_steps = env.spec.max_episode_steps if env.spec is not None else None
    return pb.EnvironmentSpec(env_id=env_id, observation_space=specs.space_to_proto(env.observation_space),
                              action_space=specs.space_to_proto(env.action_space), max_episode_steps=max_steps or 0)


class EnvironmentService:
    """Sessions of ``make_env()`` environments, at most ``max_sessions`` at once."""

    def __init__(self, make_env: Callable[[], gym.Env | MultiAgentEnv], env_id: str, max_sessions: int,
                 max_bytes: int):
        self.make_env = make_env
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.active = 0
        self.sessions_total = 0
        self.ended_steps = 0  # steps of ended sessions; live ones count their own (no lock per step)
        self.live: set[SessionBase] = set()
        self.lock = threading.Lock()
        probe = make_env()
        try:
            self.spec = environment_spec(probe, env_id)
        finally:
            probe.close()

    def GetSpec(self, request, context):
        return self.spec

    def Session(self, request_iterator, context) -> Iterator[bytes]:
        with self.lock:
            full = self.active >= self.max_sessions
            self.active += 0 if full else 1
            self.sessions_total += 0 if full else 1
        if full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"env server is at its cap of {self.max_sessions} sessions")
        try:
            env = self.make_env()
            session = (MultiAgentSession if is_multi_agent(env) else EnvSession)(env, self.max_bytes)
        except Exception as exc:  # noqa: BLE001 - the env factory is user code
            self._release(None)
            context.abort(grpc.StatusCode.INTERNAL, f"cannot create the environment: {exc}")
        with self.lock:
            self.live.add(session)
        try:
            for raw in request_iterator:
                yield session.handle(raw)
                if session.closed:
                    return
        except grpc.RpcError:
            pass  # the client vanished or cancelled: clean up below
        finally:
            session.env.close()
            self._release(session)

    def _release(self, session: SessionBase | None) -> None:
        with self.lock:
            self.active -= 1
            if session is not None:
                self.live.discard(session)
                self.ended_steps += session.steps_done

    def metrics(self) -> list[Metric]:
        """What the env server exposes to Prometheus (steps/s: ``rate(actorlearner_env_steps_total[1m])``)."""
        with self.lock:
            steps = self.ended_steps + sum(s.steps_done for s in self.live)
        return [
            Metric("env_sessions", "Open env sessions.", self.active),
            Metric("env_sessions_total", "Env sessions opened.", self.sessions_total, counter=True),
            Metric("env_steps_total", "Env steps over all sessions.", steps, counter=True),
        ]


@contextlib.contextmanager
def serve(make_env: Callable[[], gym.Env | MultiAgentEnv], env_id: str, host: str = "127.0.0.1", port: int = 0,
          max_sessions: int = 64, max_bytes: int = 64 * 2**20,
          security: SecurityConfig | None = None,
          health: Health | None = None) -> Iterator[tuple[EnvironmentService, int]]:
    """Run an env server; yields ``(service, bound port)`` (``port`` 0 picks a free one)."""
    service = EnvironmentService(make_env, env_id, max_sessions, max_bytes)
    workers = max_sessions + 4  # a session holds a worker; the rest answer GetSpec and refusals
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="env"),
                         options=grpc_options(max_bytes), interceptors=auth_interceptors(security))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("actorlearner.v1.Environment", {
        "GetSpec": grpc.unary_unary_rpc_method_handler(service.GetSpec, pb.GetSpecRequest.FromString,
                                                       pb.EnvironmentSpec.SerializeToString),
        "Session": grpc.stream_stream_rpc_method_handler(service.Session),  # bytes both ways
    }),))
    if health is not None:
        health.add_to(server)
    bound = add_port(server, f"{host}:{port}", security)
    server.start()
    try:
        yield service, bound
    finally:
        server.stop(grace=2.0).wait()
