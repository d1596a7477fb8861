"""Bearer tokens and (mutual) TLS on the learner and env servers, with real processes and certificates."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import grpc
import gymnasium as gym
import pytest

from actorlearner import specs, wire
from actorlearner.cli.common import warn_if_exposed
from actorlearner.envs import RemoteEnv, RemoteEnvError, make_env
from actorlearner.envs.server import serve
from actorlearner.transport import SecurityConfig, open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from certs import Authority
from procs import FAST_LEARNER, PACED, start_actor, start_learner, stop, wait_until

TOKEN = "correct-horse-battery-staple"


def get_status(port: int, security: SecurityConfig | None) -> pb.StatusResponse:
    with open_channel(f"127.0.0.1:{port}", security) as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=10)


def get_spec(port: int, security: SecurityConfig | None) -> pb.LearnerSpec:
    with open_channel(f"127.0.0.1:{port}", security) as channel:
        return pb_grpc.LearnerStub(channel).GetSpec(pb.LearnerSpecRequest(), timeout=10)


def connect(port: int, security: SecurityConfig | None, actor_id: str):
    """Open Connect with a valid Hello and read the first answer; raises grpc.RpcError if refused."""
    env = make_env("CartPole-v1")
    hello = pb.Hello(actor_id=actor_id, protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn",
                     env_spec=specs.env_spec("CartPole-v1", env.observation_space, env.action_space),
                     policy_version=-1)
    with open_channel(f"127.0.0.1:{port}", security) as channel:
        stream = pb_grpc.LearnerStub(channel).Connect(iter([pb.ActorMessage(hello=hello)]), timeout=10)
        first = next(stream)
        stream.cancel()
        return first


def refused_with(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


def test_learner_with_a_token_refuses_strangers_and_serves_its_actors(token_file):
    learner, port = start_learner(*FAST_LEARNER, "--auth-token-file", token_file)
    actor = start_actor(port, "trusted", "--auth-token-file", token_file, *PACED)
    try:
        good = SecurityConfig(auth_token_file=token_file)
        wait_until(lambda: get_status(port, good).policy_version >= 2, 90, "training with the token")
        for stranger in (None, SecurityConfig(auth_token="wrong"), SecurityConfig(auth_token=TOKEN + "x")):
            assert refused_with(lambda: get_status(port, stranger)) == grpc.StatusCode.UNAUTHENTICATED
            assert refused_with(lambda: get_spec(port, stranger)) == grpc.StatusCode.UNAUTHENTICATED
            assert refused_with(lambda: connect(port, stranger, "stranger")) == grpc.StatusCode.UNAUTHENTICATED
        assert connect(port, good, "friend").WhichOneof("kind") == "welcome"
        assert get_spec(port, good).algorithm == "dqn"
        assert "stranger" not in {a.actor_id for a in get_status(port, good).actors}
        shown = subprocess.run([sys.executable, "-m", "actorlearner", "status", "--learner", f"127.0.0.1:{port}",
                                "--json", "--auth-token-file", token_file], capture_output=True, text=True)
        assert shown.returncode == 0 and json.loads(shown.stdout)["policy_version"] >= 2
        denied = subprocess.run([sys.executable, "-m", "actorlearner", "status", "--learner", f"127.0.0.1:{port}"],
                                capture_output=True, text=True)
        assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr
    finally:
        assert stop(actor, learner) == [0, 0]


def test_env_server_with_a_token(tmp_path):
    secured = SecurityConfig(auth_token=TOKEN)
    with serve(lambda: gym.make("CartPole-v1"), "CartPole-v1", security=secured) as (service, port):
        for stranger in (None, SecurityConfig(auth_token="wrong")):
            with pytest.raises(RemoteEnvError) as refused:
                RemoteEnv(f"127.0.0.1:{port}", timeout=5, security=stranger)
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        env = make_env(f"grpc://127.0.0.1:{port}", secured)
        env.reset(seed=0)
        env.step(0)
        env.close()
        wait_until(lambda: service.active == 0, 30, "the session closed")


@pytest.fixture
def pki(tmp_path):
    ca, rogue = Authority(tmp_path, "ca"), Authority(tmp_path, "rogue")
    server_cert, server_key = ca.issue("learner", server=True)
    client_cert, client_key = ca.issue("actor", server=False)
    rogue_cert, rogue_key = rogue.issue("actor", server=False)
    return {
        "server": ["--tls-cert", server_cert, "--tls-key", server_key, "--tls-ca", str(ca.ca_file)],
        "client": SecurityConfig(tls_cert=client_cert, tls_key=client_key, tls_ca=str(ca.ca_file)),
        "client_args": ["--tls-cert", client_cert, "--tls-key", client_key, "--tls-ca", str(ca.ca_file)],
        "rogue": SecurityConfig(tls_cert=rogue_cert, tls_key=rogue_key, tls_ca=str(ca.ca_file)),
        "no_cert": SecurityConfig(tls_ca=str(ca.ca_file)),
        "ca": str(ca.ca_file),
        "server_pair": (server_cert, server_key),
    }


def test_mutual_tls_admits_only_certificates_signed_by_the_ca(pki):
    learner, port = start_learner(*FAST_LEARNER, *pki["server"])
    actor = start_actor(port, "certified", *pki["client_args"], *PACED)
    try:
        wait_until(lambda: get_status(port, pki["client"]).policy_version >= 2, 90, "training over mutual TLS")
        # gRPC checks client certificates in the TLS handshake: a stranger gets no session at all.
        for stranger in (pki["rogue"], pki["no_cert"], None):
            code = refused_with(lambda: connect(port, stranger, "stranger"))
            assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED), code
        actors = {a.actor_id for a in get_status(port, pki["client"]).actors}
        assert actors == {"certified"}
    finally:
        assert stop(actor, learner) == [0, 0]


def test_tls_with_a_token_needs_both(pki):
    cert, key = pki["server_pair"]
    server_side = SecurityConfig(auth_token=TOKEN, tls_cert=cert, tls_key=key)
    with serve(lambda: gym.make("CartPole-v1"), "CartPole-v1", security=server_side) as (_, port):
        with pytest.raises(RemoteEnvError) as refused:
            RemoteEnv(f"127.0.0.1:{port}", timeout=5, security=SecurityConfig(tls_ca=pki["ca"]))
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(RemoteEnvError) as plaintext:
            RemoteEnv(f"127.0.0.1:{port}", timeout=3, security=SecurityConfig(auth_token=TOKEN))
        assert plaintext.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        env = RemoteEnv(f"127.0.0.1:{port}", security=SecurityConfig(auth_token=TOKEN, tls_ca=pki["ca"]))
        env.reset(seed=1)
        env.close()


def test_exposed_servers_without_authentication_warn_loudly(caplog):
    caplog.set_level(logging.WARNING, logger="actorlearner")
    warn_if_exposed("127.0.0.1", SecurityConfig())
    warn_if_exposed("0.0.0.0", SecurityConfig(auth_token="t"))
    assert not caplog.records
    warn_if_exposed("0.0.0.0", SecurityConfig())
    assert "WITHOUT AUTHENTICATION" in caplog.text
