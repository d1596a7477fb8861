"""Hostile input against a live learner: every bad stream gets its status and changes nothing.

One real learner process and one well-behaved real actor process serve the whole module;
the bad clients are raw gRPC streams that send bytes of our choosing. "Nothing was
inserted" is read from the learner's per-actor counts (what every actor but the good one
has stored), so it is exact while the good actor keeps streaming; after each case its
batches must keep being acked and its policy lag must stay small.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

import grpc
import msgpack
import numpy as np
import pytest

from actorlearner import specs, wire
from actorlearner.envs import make_env
from actorlearner.v1 import learner_pb2 as pb
from procs import CHILD_ENV, FAST_LEARNER, PACED_ENV, launch, start_learner, status, stop, wait_until

CONNECT = "/actorlearner.v1.Learner/Connect"
MAX_MESSAGE = 1 << 20
MAX_STREAMS = 3
MAX_LAG = 3  # versions; with samples_per_insert 1 the learner publishes about one per 10 good batches
N = 5  # transitions per hostile batch
GOOD = "good"  # the well-behaved actor's id

_env = make_env("CartPole-v1")
ENV_SPEC = specs.env_spec("CartPole-v1", _env.observation_space, _env.action_space)
_env.close()


@dataclass
class Live:
    learner: subprocess.Popen
    port: int
    actor: subprocess.Popen
    actor_log: Path


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    # Not the default rate limiter: samples_per_insert 1 and a small error buffer tie training to the
    # good actor's inserts (about one version per 10 of its batches, at most ~2000 samples ahead of
    # them), so its policy lag stays within MAX_LAG however busy the machine is. The good actor steps
    # a paced CartPole (same spaces) in batches of 32: each case's check needs a few hundred of its
    # steps, not the whole module's two cores running flat out.
    learner, port = start_learner(
        *FAST_LEARNER, "--replay-capacity", "1000000", "--max-message-bytes", str(MAX_MESSAGE),
        "--max-streams", str(MAX_STREAMS), "--samples-per-insert", "1", "--rate-error-buffer", "2000",
        "--publish-every", "10", "--actor-batch-size", "32")
    log = tmp_path_factory.mktemp("good-actor") / "stderr.log"
    with open(log, "w") as stderr:
        actor = launch([sys.executable, "-m", "actorlearner", "actor", "--learner", f"127.0.0.1:{port}",
                        "--actor-id", GOOD, "--env", PACED_ENV, "--num-envs", "2", "--vector-mode", "sync"],
                       stderr=stderr, env=CHILD_ENV)
    try:
        wait_until(lambda: status(port).inserted >= 5, 90, "the good actor's first batches")
        yield Live(learner, port, actor, log)
        text = log.read_text()  # before anything stops: the good actor's one stream never broke
    finally:
        codes = stop(actor) + stop(learner)  # the actor first: a draining learner refuses new batches
    assert "reconnecting" not in text and "refused" not in text, f"the good actor's stream broke:\n{text[-2000:]}"
    assert codes == [0, 0], f"exit codes good actor/learner: {codes}"


# --------------------------------------------------------------------------- messages


def hello(actor_id: str, /, **changes) -> pb.ActorMessage:
    message = pb.Hello(actor_id=actor_id, protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn",
                       policy_version=-1)
    message.env_spec.CopyFrom(ENV_SPEC)
    for name, value in changes.items():
        if isinstance(value, pb.EnvSpec):
            getattr(message, name).CopyFrom(value)
        elif isinstance(value, list):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return pb.ActorMessage(hello=message)


def good_fields(n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    obs = rng.uniform(-0.05, 0.05, (n, 4)).astype(np.float32)
    return {"obs": obs, "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
            "discount": np.full(n, 0.99**3, np.float32), "next_obs": obs + 0.01}


def raw_payload(**arrays: dict) -> bytes:
    """A msgpack payload of good fields with some array maps replaced by hand-made ones."""
    fields = {k: wire.encode_array(v) for k, v in good_fields().items()}
    return msgpack.packb({**fields, **arrays}, use_bin_type=True)


def batch(seq: int, payload: bytes | None = None, n: int = N, codec: int = pb.CODEC_MSGPACK,
          priorities=None, policy_version: int = 0) -> pb.ActorMessage:
    """A batch; its priorities default to one per transition (the learner's Welcome asks for them)."""
    if payload is None:
        payload = wire.encode_batch(good_fields(n))
    if priorities is None:
        priorities = [1.0] * n
    return pb.ActorMessage(batch=pb.TrajectoryBatch(seq=seq, policy_version=policy_version, num_transitions=n,
                                                    payload=payload, codec=codec, priorities=priorities))


def unparsable(seed: int = 0) -> bytes:
    """Random bytes that protobuf refuses to parse as an ActorMessage."""
    rng = np.random.default_rng(seed)
    while True:
        data = rng.bytes(64)
        try:
            pb.ActorMessage.FromString(data)
        except Exception:  # noqa: BLE001 - DecodeError; anything will do
            return data


# --------------------------------------------------------------------------- streams


@dataclass
class Outcome:
    code: grpc.StatusCode | None  # None: the stream was still open when we had our acks
    details: str
    acks: list[pb.Ack]
    welcomed: bool


def converse(port: int, messages: list[pb.ActorMessage | bytes], acks: int = 0, until_welcome: bool = False,
             timeout: float = 20) -> Outcome:
    """Send ``messages`` (or raw bytes) on one Connect stream; read until the learner ends the
    stream with a status, ``acks`` acks have arrived or (``until_welcome``) a Welcome has.
    The client never half-closes first."""
    raw = [m if isinstance(m, bytes) else m.SerializeToString() for m in messages]
    done = threading.Event()

    def requests():
        yield from raw
        done.wait(timeout)

    got, welcomed = [], False
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(CONNECT, request_serializer=None,  # bytes as they are
                                     response_deserializer=pb.LearnerMessage.FromString)(requests(), timeout=timeout)
        try:
            for message in call:
                kind = message.WhichOneof("kind")
                welcomed |= kind == "welcome"
                if welcomed and until_welcome:
                    return Outcome(None, "", got, welcomed)
                if kind == "ack":
                    got.append(message.ack)
                    if len(got) == acks:
                        return Outcome(None, "", got, welcomed)
            return Outcome(grpc.StatusCode.OK, "", got, welcomed)
        except grpc.RpcError as exc:
            return Outcome(exc.code(), exc.details() or "", got, welcomed)
        finally:
            done.set()
            call.cancel()


def stored_by_others(port: int) -> tuple[int, int]:
    """(batches, transitions) the learner has stored from every actor but the good one."""
    others = [a for a in status(port).actors if a.actor_id != GOOD]
    return sum(a.inserted for a in others), sum(a.transitions for a in others)


def stored_by_good(port: int) -> int:
    return {a.actor_id: a.inserted for a in status(port).actors}[GOOD]


@contextlib.contextmanager
def watched(live: Live):
    """Yield what other actors have stored so far; afterwards, check that the good actor kept streaming."""
    good = stored_by_good(live.port)
    yield stored_by_others(live.port)
    assert_good_actor_unharmed(live, good)


def assert_good_actor_unharmed(live: Live, good_before: int) -> None:
    """Its stream still carries batches (more than a window's worth acked) and policy updates."""
    window = 8
    wait_until(lambda: stored_by_good(live.port) > good_before + window, 30,
               "the good actor's batches to keep being acked")

    def caught_up():
        s = status(live.port)
        good = {a.actor_id: a for a in s.actors}[GOOD]
        return good.connected and good.lag <= MAX_LAG

    wait_until(caught_up, 30, f"the good actor to stay connected within {MAX_LAG} versions")
    assert live.actor.poll() is None and live.learner.poll() is None


def silent_stream_holding_the_last_slot(port: int, connect, silent) -> tuple[grpc.Call, Outcome]:
    """Open a stream that never sends (``connect(silent())``) and poll with probe streams until one
    is refused: the silent stream holds the last slot then. A probe that got in before the silent
    stream reached the learner's handler (or after a hello timeout ended it) may take the slot it
    wanted; a silent stream that has ended is opened again. Returns it and the refusal."""
    squatter = connect(silent(), timeout=60)

    def refusal():
        nonlocal squatter
        probe = converse(port, [hello("one-too-many")], until_welcome=True)
        if not probe.welcomed:
            return probe
        if squatter.done():
            squatter = connect(silent(), timeout=60)
        return None

    outcome = wait_until(refusal, 60, "a probe stream to find every slot taken")
    return squatter, outcome


def assert_refused(outcome: Outcome, code: grpc.StatusCode, *words: str) -> None:
    assert outcome.code == code, f"expected {code.name}, got {outcome}"
    for word in words:
        assert word in outcome.details, f"{word!r} not in the reason {outcome.details!r}"


# --------------------------------------------------------------------------- cases

BAD_BATCHES = {
    "garbage payload": (batch(1, payload=b"this is not msgpack \xc1\xc1"), "not valid msgpack"),
    "garbage zlib payload": (batch(1, payload=b"not zlib at all", codec=pb.CODEC_MSGPACK_ZLIB), "not valid zlib"),
    "unknown dtype": (batch(1, payload=raw_payload(obs={"dtype": "complex64", "shape": [N, 4],
                                                         "data": bytes(N * 4 * 8)})), "unknown dtype"),
    "object dtype": (batch(1, payload=raw_payload(action={"dtype": "object", "shape": [N], "data": bytes(N * 8)})),
                     "unknown dtype"),
    "shape and bytes disagree": (batch(1, payload=raw_payload(obs={"dtype": "float32", "shape": [N, 4],
                                                                    "data": bytes(N * 4 * 4 - 4)})), "needs 80 bytes"),
    "shape and num_transitions disagree": (batch(1, n=N + 1, payload=wire.encode_batch(good_fields(N))),
                                           "expected (6, 4)"),
    "wrong field dtype": (batch(1, payload=raw_payload(obs=wire.encode_array(np.zeros((N, 4))))), "expected float32"),
    "missing field": (batch(1, payload=msgpack.packb({k: wire.encode_array(v) for k, v in good_fields().items()
                                                      if k != "reward"})), "missing fields: reward"),
    "NaN reward": (batch(1, payload=wire.encode_batch({**good_fields(), "reward": np.full(N, np.nan, np.float32)})),
                   "'reward' contains NaN"),
    "inf reward": (batch(1, payload=wire.encode_batch({**good_fields(), "reward": np.full(N, np.inf, np.float32)})),
                   "'reward' contains inf"),
    "-inf obs": (batch(1, payload=wire.encode_batch({**good_fields(), "obs": np.full((N, 4), -np.inf, np.float32)})),
                 "'obs' contains inf"),
    "NaN priority": (batch(1, priorities=[1.0, float("nan"), 1.0, 1.0, 1.0]), "finite and non-negative"),
    "inf priority": (batch(1, priorities=[float("inf")] * N), "finite and non-negative"),
    "negative priority": (batch(1, priorities=[1.0, 1.0, -0.5, 1.0, 1.0]), "finite and non-negative"),
    "too few priorities": (batch(1, priorities=[1.0, 1.0]), "2 priorities for 5 transitions"),
    "no priorities where the Welcome asks for them": (batch(1, priorities=[]), "actor_priorities is true"),
    "unspecified codec": (batch(1, codec=pb.CODEC_UNSPECIFIED), "codec is unspecified"),
    "unknown codec": (batch(1, codec=7), "unknown codec"),
    "no transitions": (batch(1, n=0, payload=wire.encode_batch(good_fields(1))), "num_transitions"),
    "negative policy version": (batch(1, policy_version=-5), "policy_version"),
    "empty message": (pb.ActorMessage(), "empty ActorMessage"),
    "unknown fields only": (b"\x78\x01", "empty ActorMessage"),  # field 15: parses to an empty message
    "unparsable bytes": (unparsable(), "does not parse as an ActorMessage"),
}


@pytest.mark.parametrize("name", list(BAD_BATCHES))
def test_bad_message_after_hello_is_invalid_argument(live, name):
    message, reason = BAD_BATCHES[name]
    with watched(live) as before:
        outcome = converse(live.port, [hello(f"bad-{name}"), message])
        assert outcome.welcomed
        assert_refused(outcome, grpc.StatusCode.INVALID_ARGUMENT, reason)
        assert stored_by_others(live.port) == before


def test_random_bytes_as_the_first_message_are_invalid_argument(live):
    """gRPC's own deserializer would answer a bare INTERNAL; the learner says what is wrong."""
    with watched(live) as before:
        for seed in range(3):
            outcome = converse(live.port, [unparsable(seed), hello("after-garbage")])
            assert not outcome.welcomed
            assert_refused(outcome, grpc.StatusCode.INVALID_ARGUMENT, "does not parse as an ActorMessage")
        assert stored_by_others(live.port) == before


def test_message_over_the_size_limit_is_resource_exhausted(live):
    big = batch(1, payload=bytes(MAX_MESSAGE + 1024))
    with watched(live) as before:
        outcome = converse(live.port, [hello("too-big"), big])  # gRPC may end it before the Welcome is out
        assert_refused(outcome, grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max")
        first = converse(live.port, [big])  # before Hello too
        assert_refused(first, grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max")
        assert stored_by_others(live.port) == before


def test_zlib_bomb_is_resource_exhausted(live):
    bomb = zlib.compress(bytes(64 * MAX_MESSAGE), 9)  # 64 MiB of zeros in about 64 KiB
    assert len(bomb) < MAX_MESSAGE // 4
    with watched(live) as before:
        outcome = converse(live.port, [hello("bomb"), batch(1, payload=bomb, codec=pb.CODEC_MSGPACK_ZLIB)])
        assert_refused(outcome, grpc.StatusCode.RESOURCE_EXHAUSTED, "decompressed payload exceeds")
        assert stored_by_others(live.port) == before


def test_oversized_array_header_is_refused_before_allocating(live):
    """A header claiming a huge array with a few bytes of data: refused from the header alone."""
    huge = {"dtype": "float64", "shape": [2**40, 4], "data": b"\x00" * 8}
    with watched(live) as before:
        outcome = converse(live.port, [hello("huge-header"), batch(1, payload=raw_payload(obs=huge))])
        assert_refused(outcome, grpc.StatusCode.RESOURCE_EXHAUSTED, "field 'obs'")
        assert stored_by_others(live.port) == before


def test_batch_before_hello_is_failed_precondition(live):
    with watched(live) as before:
        outcome = converse(live.port, [batch(1)])
        assert not outcome.welcomed
        assert_refused(outcome, grpc.StatusCode.FAILED_PRECONDITION, "first message of a stream must be Hello")
        assert stored_by_others(live.port) == before


def test_second_hello_is_failed_precondition(live):
    with watched(live) as before:
        outcome = converse(live.port, [hello("twice"), hello("twice")])
        assert_refused(outcome, grpc.StatusCode.FAILED_PRECONDITION, "Hello may only be the first message")
        assert stored_by_others(live.port) == before


def other_env_spec() -> pb.EnvSpec:
    env = make_env("Acrobot-v1")
    try:
        return specs.env_spec("Acrobot-v1", env.observation_space, env.action_space)
    finally:
        env.close()


@pytest.mark.parametrize("changes, code, words", [
    ({"env_spec": other_env_spec()}, grpc.StatusCode.FAILED_PRECONDITION, ("env spec differs", "observation shape")),
    ({"env_spec": pb.EnvSpec()}, grpc.StatusCode.FAILED_PRECONDITION, ("env spec differs",)),
    ({"protocol_version": wire.PROTOCOL_VERSION + 1}, grpc.StatusCode.FAILED_PRECONDITION,
     (f"protocol version {wire.PROTOCOL_VERSION + 1} is not supported",)),
    ({"protocol_version": 0}, grpc.StatusCode.FAILED_PRECONDITION, ("protocol version 0",)),
    ({"algorithm": "ppo"}, grpc.StatusCode.FAILED_PRECONDITION, ("algorithm 'ppo'", "runs 'dqn'")),
    ({"batch_fields": [pb.FieldSpec(name="obs", dtype="uint8", shape=[4])]}, grpc.StatusCode.FAILED_PRECONDITION,
     ("holds batches with fields obs:uint8[4]", "expects obs:float32[4], action:int64[]")),
    ({"actor_id": ""}, grpc.StatusCode.INVALID_ARGUMENT, ("actor_id must not be empty",)),
], ids=["env spec", "empty env spec", "future protocol", "protocol 0", "algorithm", "batch fields", "no actor id"])
def test_refused_hello(live, changes, code, words):
    with watched(live) as before:
        outcome = converse(live.port, [hello("refused-hello", **changes), batch(1)])
        assert not outcome.welcomed
        assert_refused(outcome, code, *words)
        assert stored_by_others(live.port) == before


def test_duplicate_seq_is_acked_and_inserted_once(live):
    with watched(live) as before:
        outcome = converse(live.port, [hello("dup"), batch(7), batch(7)], acks=2)
        assert [(a.seq, a.accepted, a.reason) for a in outcome.acks] == [(7, True, ""), (7, True, "duplicate")]
        assert stored_by_others(live.port) == (before[0] + 1, before[1] + N)
        # A reconnect that resends it (as an actor does with its unacked window): still once.
        again = converse(live.port, [hello("dup"), batch(7)], acks=1)
        assert [(a.seq, a.accepted, a.reason) for a in again.acks] == [(7, True, "duplicate")]
        assert stored_by_others(live.port) == (before[0] + 1, before[1] + N)


def test_seq_going_backwards_is_acked_as_a_duplicate_and_not_inserted(live):
    """The duplicate filter is a high-water mark per actor_id (learner.proto): seq <= highest stored is a duplicate."""
    with watched(live) as before:
        outcome = converse(live.port, [hello("back"), batch(100), batch(99), batch(101)], acks=3)
        assert [(a.seq, a.accepted, a.reason) for a in outcome.acks] == [
            (100, True, ""), (99, True, "duplicate"), (101, True, "")]
        assert stored_by_others(live.port) == (before[0] + 2, before[1] + 2 * N)
        later = converse(live.port, [hello("back"), batch(5), batch(102)], acks=2)
        assert [(a.seq, a.reason) for a in later.acks] == [(5, "duplicate"), (102, "")]
        assert stored_by_others(live.port) == (before[0] + 3, before[1] + 3 * N)


def test_streams_past_the_cap_are_refused_with_resource_exhausted(live):
    """The good actor holds one of MAX_STREAMS slots; a silent stream and a welcomed one take the
    rest; the next is refused at once (not queued), and a freed slot can be taken again."""
    wait_until(lambda: [a.actor_id for a in status(live.port).actors if a.connected] == [GOOD], 20,
               "earlier cases' streams to close")
    held, stop_sending = [], threading.Event()

    def silent():
        stop_sending.wait(60)
        yield from ()

    def hello_then_wait():
        yield hello("holder").SerializeToString()
        stop_sending.wait(60)

    with grpc.insecure_channel(f"127.0.0.1:{live.port}") as channel:
        connect = channel.stream_stream(CONNECT, request_serializer=None,
                                        response_deserializer=pb.LearnerMessage.FromString)
        try:
            held.append(connect(hello_then_wait(), timeout=60))
            assert next(held[0]).WhichOneof("kind") == "welcome"
            squatter, outcome = silent_stream_holding_the_last_slot(live.port, connect, silent)
            held.append(squatter)
            # A queued stream would have waited out converse's deadline (DEADLINE_EXCEEDED) instead.
            assert_refused(outcome, grpc.StatusCode.RESOURCE_EXHAUSTED, f"cap of {MAX_STREAMS} concurrent streams")
            assert status(live.port).learner_id  # GetStatus still answers at the cap
        finally:
            stop_sending.set()
            for call in held:
                call.cancel()
    assert_good_actor_unharmed(live, stored_by_good(live.port))

    def welcomed_again():
        return converse(live.port, [hello("after-cap")], until_welcome=True).welcomed

    wait_until(welcomed_again, 60, "a freed slot to take a new stream")


def test_a_stream_that_never_says_hello_is_cancelled_and_frees_its_slot():
    learner, port = start_learner(*FAST_LEARNER, "--max-streams", "1", "--hello-timeout", "2")
    try:
        stop_sending = threading.Event()

        def silent():
            stop_sending.wait(60)
            yield from ()

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            connect = channel.stream_stream(CONNECT, request_serializer=None,
                                            response_deserializer=pb.LearnerMessage.FromString)
            try:
                squatter, outcome = silent_stream_holding_the_last_slot(port, connect, silent)
                assert_refused(outcome, grpc.StatusCode.RESOURCE_EXHAUSTED, "cap of 1")
                with pytest.raises(grpc.RpcError) as ended:
                    next(squatter)  # the learner cancels it once the hello timeout is up
                assert ended.value.code() == grpc.StatusCode.CANCELLED
            finally:
                stop_sending.set()
        wait_until(lambda: converse(port, [hello("after-timeout")], until_welcome=True).welcomed, 60,
                   "the slot the silent stream held")
    finally:
        assert stop(learner) == [0]
