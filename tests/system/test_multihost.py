"""A multi-host rehearsal without a cluster: learner and actors in their own network namespaces.

Each actor's namespace is joined to the learner's by a veth pair with its own /30, so every
process has its own address and talks over it, as pods do; health checks cross the links
too. Needs root and iproute2 (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from procs import FAST_LEARNER, stop, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="creating network namespaces needs root and iproute2")

ACTORS = 2
PORT, HEALTH_PORT = 50051, 50052


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """A learner namespace and one namespace per actor, each joined to the learner's by a veth pair."""

    def __init__(self):
        tag = f"al{os.getpid() % 100000}"
        self.learner = f"{tag}-learner"
        self.actors = [f"{tag}-actor{i}" for i in range(ACTORS)]
        self.links = [(f"{tag}l{i}", f"{tag}a{i}") for i in range(ACTORS)]

    def learner_address(self, i: int) -> str:
        return f"10.231.{i}.1"

    def actor_address(self, i: int) -> str:
        return f"10.231.{i}.2"

    def __enter__(self) -> Hosts:
        try:
            for ns in (self.learner, *self.actors):
                ip("netns", "add", ns)
                ip("-n", ns, "link", "set", "lo", "up")
            for i, ((learner_end, actor_end), ns) in enumerate(zip(self.links, self.actors)):
                ip("link", "add", learner_end, "netns", self.learner, "type", "veth", "peer", "name", actor_end,
                   "netns", ns)
                ip("-n", self.learner, "addr", "add", f"{self.learner_address(i)}/30", "dev", learner_end)
                ip("-n", ns, "addr", "add", f"{self.actor_address(i)}/30", "dev", actor_end)
                ip("-n", self.learner, "link", "set", learner_end, "up")
                ip("-n", ns, "link", "set", actor_end, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in (self.learner, *self.actors):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes its veth ends along

    def run(self, ns: str, *args: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *args], **kwargs)

    def check(self, ns: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", ns, sys.executable, *args], capture_output=True, text=True,
                              timeout=30)


HEALTH = """
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=sys.argv[2]), timeout=5)
print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
"""


def health(hosts: Hosts, ns: str, address: str, service: str = "") -> str:
    done = hosts.check(ns, "-c", HEALTH, address, service)
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def test_learner_and_actors_on_their_own_hosts(tmp_path):
    token = tmp_path / "token"
    token.write_text("rehearsal")
    auth = ["--auth-token-file", str(token)]
    with Hosts() as hosts:
        learner = hosts.run(hosts.learner, "-m", "actorlearner", "learner", *FAST_LEARNER, "--host", "0.0.0.0",
                            "--port", str(PORT), "--num-actors", str(ACTORS), *auth, stdout=subprocess.PIPE, text=True)
        assert re.search(r"listening on 0\.0\.0\.0:50051", learner.stdout.readline())
        actors = [hosts.run(ns, "-m", "actorlearner", "actor", "--learner", f"{hosts.learner_address(i)}:{PORT}",
                            "--actor-id", f"pod-{i}", "--num-envs", "2", "--seed", str(i), "--listen-host", "0.0.0.0",
                            "--health-port", str(HEALTH_PORT), *auth)
                  for i, ns in enumerate(hosts.actors)]
        try:
            # Probes across the links: each actor checks the learner, the learner checks each actor.
            for i, ns in enumerate(hosts.actors):
                assert health(hosts, ns, f"{hosts.learner_address(i)}:{PORT}") == "SERVING"
                wait_until(lambda: health(hosts, hosts.learner, f"{hosts.actor_address(i)}:{HEALTH_PORT}",
                                          "connected") == "SERVING", 60, f"actor {i} connected over its link")

            def trained():
                done = hosts.check(hosts.learner, "-m", "actorlearner", "status", "--learner", f"127.0.0.1:{PORT}",
                                   "--json", *auth)
                summary = json.loads(done.stdout) if done.returncode == 0 else {}
                lagging = [a for a in summary.get("actors", []) if a["connected"] and a["policy_version"] >= 1]
                return summary.get("policy_version", 0) >= 3 and len(lagging) == ACTORS and summary

            summary = wait_until(trained, 120, "training with both actors on their own hosts")
            assert {a["id"] for a in summary["actors"]} == {f"pod-{i}" for i in range(ACTORS)}
            # An actor's host cannot reach the learner's loopback: they really are apart.
            assert "SERVING" != health(hosts, hosts.actors[0], f"127.0.0.1:{PORT}")
        finally:
            codes = stop(*actors, learner)
    assert codes == [0] * (ACTORS + 1), f"exit codes: {codes}"
