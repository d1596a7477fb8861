"""Relays between actors and the learner: training through one, exactly once through cut links and a
relay killed and restarted, chains of relays, tokens, and what status shows."""

from __future__ import annotations

import contextlib
import json

import grpc
import numpy as np
import pytest

from actorlearner import specs, wire
from actorlearner.actor.link import LearnerLink, LinkError
from actorlearner.cli.control import status_command
from actorlearner.config import LearnerConfig, RelayConfig, StatusConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve as serve_learner
from actorlearner.relay.server import serve as serve_relay
from actorlearner.transport import SecurityConfig, open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from probes import health, scrape
from procs import FAST_LEARNER, free_port, start_actor, start_learner, start_relay, stop, wait_until
from streams import BATCH, batch_for, make_hello
from tcp_proxy import TcpProxy

TOKEN = "relay-test-token"


def make_learner(**overrides) -> Learner:
    """A learner that does not train: nothing is sampled, and the test's batches stay far below the
    rate limiter's admission, so no insert waits."""
    return Learner(LearnerConfig(env="CartPole-v1", replay_capacity=10_000, eval_every=0, max_unacked=8, **overrides))


def relay_config(upstream_port: int, relay_id: str, **overrides) -> RelayConfig:
    return RelayConfig(upstream=f"127.0.0.1:{upstream_port}", port=0, relay_id=relay_id, reconnect_initial=0.05,
                       reconnect_max=0.5, **overrides)


@contextlib.contextmanager
def relay_at(upstream_port: int, relay_id: str, **overrides):
    """An in-process relay, once it is connected upstream; yields the relay and its port."""
    with serve_relay(relay_config(upstream_port, relay_id, **overrides)) as (relay, port):
        wait_until(lambda: relay.up or relay.failed.is_set(), 60, f"relay {relay_id} to connect upstream")
        yield relay, port


def get_status(port: int, security: SecurityConfig | None = None) -> pb.StatusResponse:
    with open_channel(f"127.0.0.1:{port}", security) as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=30)  # a loaded machine


def stored_once(learner: Learner, seqs: int) -> None:
    """Every item of batches 1..seqs is in the replay exactly once (batch_for marks them (seq, i))."""
    obs = learner.replay.buffer.state_dict()["field.obs"].numpy().reshape(len(learner.replay), -1)
    counts = np.bincount(obs[:, 0].astype(np.int64), minlength=seqs + 1)
    assert (counts[1:] == BATCH).all(), f"per-seq item counts: {dict(enumerate(counts))}"
    assert len(learner.replay) == BATCH * seqs and learner.ingestion.inserted_batches == seqs
    for seq in range(1, seqs + 1):
        assert np.array_equal(np.sort(obs[obs[:, 0] == seq, 1]), np.arange(BATCH))


def link_to(port: int, learner: Learner, actor_id: str, security: SecurityConfig | None = None) -> LearnerLink:
    return LearnerLink(f"127.0.0.1:{port}", make_hello(learner, actor_id), 16 << 20, reconnect_initial=0.05,
                       reconnect_max=0.5, security=security).start()


def send(link: LearnerLink, learner: Learner, seqs: range) -> None:
    for seq in seqs:
        assert link.send_batch(seq, batch_for(learner, seq), timeout=60)


def by_id(status: pb.StatusResponse) -> dict[str, pb.ActorStatus]:
    return {a.actor_id: a for a in status.actors}


def test_a_chain_of_relays_carries_batches_acks_policies_and_status(capsys):
    """actor -> relay b -> relay a -> learner: stored once, acked, versions fan out, each status tells its part."""
    learner = make_learner(num_actors=3)
    with serve_learner(learner, "127.0.0.1", 0) as port, relay_at(port, "relay-a") as (a, a_port), \
            relay_at(a_port, "relay-b") as (b, b_port):
        links = [link_to(b_port, learner, "behind-b"), link_to(a_port, learner, "behind-a")]
        for link, first in zip(links, (1, 101)):
            send(link, learner, range(first, first + 30))
        for link in links:
            assert link.flush(timeout=60), f"{link.unacked} batches never acked"
        learner.progress.version += 1
        learner.training.publish(); learner.publishing.flush()
        for link in links:
            wait_until(lambda: (p := link.take_policy()) and p.version == learner.version, 60, "the new version")
        indices = sorted(link.welcome.settings.actor_index for link in links)
        assert indices == [0, 1] and all(link.welcome.settings.num_actors == 3 for link in links)
        assert a.broadcast.serializations == b.broadcast.serializations == 2  # one copy per version and relay

        actors = by_id(learner.status())
        assert actors["relay-a"].relay and actors["relay-a"].connected and "relay-b" not in actors
        for actor_id in ("behind-a", "behind-b"):
            assert actors[actor_id].via == "relay-a" and actors[actor_id].connected and actors[actor_id].inserted == 30
        at_a = by_id(get_status(a_port))
        assert at_a["relay-b"].relay and at_a["behind-b"].via == "relay-b" and at_a["behind-a"].via == ""
        assert at_a["behind-a"].inserted == 30 and at_a["behind-a"].transitions == 30 * BATCH
        at_b = get_status(b_port)
        assert [a.actor_id for a in at_b.actors] == ["behind-b"] and at_b.learner_id == learner.learner_id
        assert at_b.policy_version == learner.version
        assert status_command(StatusConfig(learner=f"127.0.0.1:{a_port}", json=True, timeout=10)) == 0
        shown = {a["id"]: a for a in json.loads(capsys.readouterr().out)["actors"]}
        assert shown["relay-b"]["relay"] and shown["behind-b"]["via"] == "relay-b"
        with grpc.insecure_channel(f"127.0.0.1:{b_port}") as channel:
            stub = pb_grpc.LearnerStub(channel)
            assert stub.GetSpec(pb.LearnerSpecRequest(), timeout=10) == learner.spec()
            stub.SetParameters(pb.SetParametersRequest(parameters=[pb.Parameter(name="dqn-epsilon-base",
                                                                                value="0.25")]), timeout=10)
        for link in links:  # a new Welcome on the live stream: same index, the new settings
            wait_until(lambda: '"epsilon_base": 0.25' in link.welcome.settings.algorithm_config, 60, "the new settings")
            assert link.welcomes == 1 + 1 and link.reconnects == 0
        assert sorted(link.welcome.settings.actor_index for link in links) == indices
        for link in links:
            link.close()
        wait_until(lambda: not any(s.connected for s in learner.status().actors if not s.relay), 30,
                   "the actors to leave the learner through the relays")
    obs = learner.replay.buffer.state_dict()["field.obs"].numpy()
    assert len(learner.replay) == 60 * BATCH and sorted(set(obs.reshape(60 * BATCH, -1)[:, 0])) == \
        [*range(1, 31), *range(101, 131)]


def test_the_learner_refuses_bad_actors_behind_a_relay_one_by_one():
    """A mismatched env spec (its window sent right after its Hello) and a batch that does not decode
    end those actors' streams with the learner's status, through the relay; its stream goes on."""
    learner = make_learner()
    with serve_learner(learner, "127.0.0.1", 0) as port, relay_at(port, "relay") as (relay, relay_port):
        hello = make_hello(learner, "wrong-env")
        hello.env_spec.CopyFrom(specs.env_spec("MountainCar-v0", *_spaces("MountainCar-v0")))
        mismatched = LearnerLink(f"127.0.0.1:{relay_port}", hello, 16 << 20)
        assert mismatched.send_batch(1, batch_for(learner, 1), timeout=5)  # goes right after the Hello
        mismatched.start()
        garbled = link_to(relay_port, learner, "garbled")
        assert garbled.send_batch(1, wire.encode_batch_message(1, 0, BATCH, b"not msgpack", wire.Codec.MSGPACK), 5)
        for link, code, reason in ((mismatched, "FAILED_PRECONDITION", "env spec differs"),
                                   (garbled, "INVALID_ARGUMENT", "")):
            wait_until(lambda: link.error is not None, 60, f"the refusal of {link.hello.actor_id}")
            assert isinstance(link.error, LinkError) and code in str(link.error) and reason in str(link.error)
            link.close()
        good = link_to(relay_port, learner, "good")
        send(good, learner, range(1, 4))
        assert good.flush(timeout=60)
        good.close()
        assert relay.connects == 1 and learner.ingestion.inserted_batches == 3


def _spaces(env_id: str):
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def test_tokens_at_the_relay_and_upstream(tmp_path):
    """The relay refuses callers without its token and sends it upstream; a relay without the
    learner's token is refused for good."""
    security = SecurityConfig(auth_token=TOKEN)
    learner = make_learner(security=security)
    with serve_learner(learner, "127.0.0.1", 0) as port:
        with relay_at(port, "secured", security=security) as (relay, relay_port):
            assert relay.up
            with pytest.raises(grpc.RpcError) as refused:
                get_status(relay_port, SecurityConfig(auth_token="wrong"))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stranger = link_to(relay_port, learner, "stranger", SecurityConfig(auth_token="wrong"))
            wait_until(lambda: stranger.error is not None, 60, "the stranger's refusal")
            assert "UNAUTHENTICATED" in str(stranger.error)
            stranger.close()
            friend = link_to(relay_port, learner, "friend", security)
            send(friend, learner, range(1, 4))
            assert friend.flush(timeout=60)
            assert by_id(get_status(relay_port, security))["friend"].inserted == 3
            friend.close()
        with relay_at(port, "tokenless") as (relay, _):
            assert relay.failed.is_set() and "UNAUTHENTICATED" in str(relay.error) and not relay.up


def test_exactly_once_through_cuts_on_both_sides_and_a_relay_killed_and_restarted():
    """actor link -> proxy a -> relay process -> proxy b -> learner. Each side is cut twice with
    HELD batches in flight (once after the learner stored them but before their acks got back,
    once before they reached it), then the relay is SIGKILLed with stored batches unacked and
    restarted on its port: every batch is stored exactly once and all are acked."""
    per_phase, held, seqs = 20, 4, 0
    learner = make_learner()
    with serve_learner(learner, "127.0.0.1", 0) as port:
        proxy_b = TcpProxy(port)
        relay_port = free_port()
        relay, _ = start_relay(proxy_b.port, "cut-relay", port=relay_port)
        proxy_a = TcpProxy(relay_port)
        link = link_to(proxy_a.port, learner, "cutter")
        try:
            def phase(proxy: TcpProxy | None, acks_lost: bool) -> None:
                nonlocal seqs
                send(link, learner, range(seqs + 1, seqs + per_phase - held + 1))
                seqs += per_phase - held
                assert link.flush(timeout=60), f"{link.unacked} batches never acked"
                stalled = proxy or proxy_b
                stalled.stall(up_after=None if acks_lost else 0, down_after=0 if acks_lost else None)
                send(link, learner, range(seqs + 1, seqs + held + 1))
                seqs += held
                if acks_lost:
                    wait_until(lambda: learner.ingestion.inserted_batches == seqs, 60, "the learner to store the held batches")
                assert link.unacked == held
                if proxy is None:
                    nonlocal relay
                    relay.kill()
                    relay.wait()
                    proxy_b.resume()
                    relay, _ = start_relay(proxy_b.port, "cut-relay", port=relay_port)
                else:
                    proxy.cut()
                    proxy.resume()

            for proxy in (proxy_a, proxy_b):
                for acks_lost in (True, False):
                    phase(proxy, acks_lost)
            phase(None, acks_lost=True)
            send(link, learner, range(seqs + 1, seqs + per_phase + 1))
            seqs += per_phase
            assert link.flush(timeout=60), f"{link.unacked} batches never acked"
            assert link.reconnects >= 5
            actors = by_id(learner.status())
            assert actors["cutter"].via == "cut-relay" and actors["cutter"].connected and actors["cut-relay"].relay
            assert actors["cutter"].inserted == seqs and actors["cutter"].duplicates >= 3 * held
        finally:
            link.close()
            stop(relay)
            proxy_a.close()
            proxy_b.close()
    stored_once(learner, seqs)


def test_actor_processes_behind_a_relay_process_train_and_follow_the_policy():
    learner, port = start_learner(*FAST_LEARNER, "--num-actors", "2")
    metrics_port = free_port()
    relay, relay_port = start_relay(port, "trainer-relay", "--metrics-port", str(metrics_port))
    actors = [start_actor(relay_port, f"relayed-{i}", "--seed", str(i)) for i in range(2)]
    try:
        def behind_reach(version: int):
            """The status once training went on and both actors behind the relay run ``version`` or newer."""
            s = get_status(port)
            behind = [a for a in s.actors if a.via == "trainer-relay" and a.connected]
            return (s.updates > 0 and s.policy_version >= 10 and len(behind) == 2
                    and all(a.policy_version >= version for a in behind) and s)

        # Following means running versions published after a moment seen here. (Not a bound on
        # the lag: the versions actors report ride behind their rate-limited windows of batches.)
        published = wait_until(lambda: behind_reach(1), 180, "training to go on, the actors behind the relay "
                               "running its weights").policy_version
        s = wait_until(lambda: behind_reach(published), 180, f"the actors behind the relay to run version "
                       f"{published} or newer")
        entries = by_id(s)
        assert entries["trainer-relay"].relay and entries["trainer-relay"].connected
        assert {a.actor_id for a in s.actors if a.connected and not a.via} == {"trainer-relay"}  # one stream
        assert all(entries[f"relayed-{i}"].inserted > 0 for i in range(2))
        at_relay = get_status(relay_port)
        assert sorted(a.actor_id for a in at_relay.actors) == ["relayed-0", "relayed-1"]
        assert at_relay.learner_id == s.learner_id and at_relay.policy_version >= 10
        assert health(relay_port) == "SERVING"
        scraped = scrape(metrics_port)
        assert scraped["actorlearner_relay_upstream_connected"] == 1 and scraped["actorlearner_connected_actors"] == 2
        assert scraped["actorlearner_relay_acks_total"] > 0 and scraped["actorlearner_policy_version"] >= 10
        assert stop(*actors) == [0, 0]  # they flushed their windows through the relay
    finally:
        codes = stop(*actors, relay, learner)
    assert codes[2:] == [0, 0]


def test_an_actor_that_moves_from_a_relay_to_the_learner_resends_and_nothing_is_stored_twice():
    """Its batches stored but their acks held between the relay and the actor, the actor's next
    connection goes straight to the learner: it resends its window, acked as duplicates."""
    learner = make_learner()
    with serve_learner(learner, "127.0.0.1", 0) as port, relay_at(port, "first-hop") as (_, relay_port):
        network = TcpProxy(relay_port)
        link = link_to(network.port, learner, "mover")
        try:
            send(link, learner, range(1, 11))
            assert link.flush(timeout=60)
            network.stall(up_after=None, down_after=0)
            send(link, learner, range(11, 15))
            wait_until(lambda: learner.ingestion.inserted_batches == 14, 60, "the learner to store the held batches")
            network.target_port = port  # the next connection reaches the learner itself
            network.cut()
            network.resume()
            send(link, learner, range(15, 21))
            assert link.flush(timeout=60), f"{link.unacked} batches never acked"
            mover = by_id(learner.status())["mover"]
            assert mover.via == "" and mover.connected and mover.duplicates == 4 and mover.inserted == 20
        finally:
            link.close()
            network.close()
    stored_once(learner, 20)


@pytest.mark.parametrize("through_relay", [False, True])
def test_actor_id_on_an_actors_own_stream_is_invalid_argument(through_relay):
    learner = make_learner()
    with serve_learner(learner, "127.0.0.1", 0) as port, relay_at(port, "strict") as (_, relay_port):
        hello = make_hello(learner, "impostor")
        batch = pb.ActorMessage.FromString(batch_for(learner, 1))
        batch.actor_id = "someone-else"
        with grpc.insecure_channel(f"127.0.0.1:{relay_port if through_relay else port}") as channel:
            stream = pb_grpc.LearnerStub(channel).Connect(iter([pb.ActorMessage(hello=hello), batch]), timeout=30)
            with pytest.raises(grpc.RpcError) as ended:
                for _ in stream:
                    pass
        assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "relay" in ended.value.details()
        assert learner.ingestion.inserted_batches == 0


def test_a_message_over_the_learners_limit_ends_that_actors_stream_at_the_relay_alone():
    learner = make_learner(max_message_bytes=1 << 20)
    with serve_learner(learner, "127.0.0.1", 0) as port, relay_at(port, "guard") as (relay, relay_port):
        big = wire.encode_batch_message(1, 0, BATCH, b"x" * (2 << 20), wire.Codec.MSGPACK)
        with grpc.insecure_channel(f"127.0.0.1:{relay_port}") as channel:
            stream = pb_grpc.LearnerStub(channel).Connect(
                iter([pb.ActorMessage(hello=make_hello(learner, "oversized")), pb.ActorMessage.FromString(big)]),
                timeout=30)
            with pytest.raises(grpc.RpcError) as ended:
                for _ in stream:
                    pass
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_message_bytes" in ended.value.details()
        good = link_to(relay_port, learner, "good")
        send(good, learner, range(1, 4))
        assert good.flush(timeout=60)
        good.close()
        assert relay.connects == 1 and learner.ingestion.inserted_batches == 3
