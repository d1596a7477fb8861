"""An actor written from proto/actorlearner/v1/learner.proto's text and docs/policy-network.md alone.

Nothing here imports actorlearner: the messages come from compiling the proto with protoc at run time
into a private descriptor pool, payloads are msgpack + numpy as the proto's `Codec` comment says, and
the "dqn" network is numpy following docs/policy-network.md.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from pathlib import Path

import grpc
import msgpack
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "proto"
PACKAGE = "actorlearner.v1"


class Proto:
    """learner.proto compiled now: message classes by name (``proto.Hello``), enum values, the text."""

    def __init__(self, out_dir: Path):
        descriptors = out_dir / "learner.desc"
        files = sorted(str(p) for p in (PROTO_ROOT / "actorlearner" / "v1").glob("*.proto"))
        code = protoc.main(["protoc", f"-I{PROTO_ROOT}", "--include_imports",
                            f"--descriptor_set_out={descriptors}", *files])
        assert code == 0, f"protoc failed on {files}"
        self.pool = descriptor_pool.DescriptorPool()  # private: no clash with any generated module
        for file in descriptor_pb2.FileDescriptorSet.FromString(descriptors.read_bytes()).file:
            self.pool.Add(file)
        self.text = (PROTO_ROOT / "actorlearner" / "v1" / "learner.proto").read_text()
        self.service = self.pool.FindServiceByName(f"{PACKAGE}.Learner")

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))

    def enum_value(self, enum: str, name: str) -> int:
        return self.pool.FindEnumTypeByName(f"{PACKAGE}.{enum}").values_by_name[name].number


# ---------------------------------------------------------------- calls to the learner

def poll(predicate, timeout: float, what: str):
    """``predicate()`` once truthy; AssertionError naming ``what`` past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Client:
    """The Learner service on one channel, by method name from the proto's service descriptor."""

    def __init__(self, proto: Proto, port: int):
        self.proto = proto
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)])

    def _method(self, name: str):
        method = self.proto.service.methods_by_name[name]
        output = message_factory.GetMessageClass(method.output_type)
        return f"/{self.proto.service.full_name}/{name}", output.FromString

    def call(self, name: str, request):
        path, decode = self._method(name)
        return self.channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                        response_deserializer=decode)(request, timeout=60)

    def spec(self):
        return self.call("GetSpec", self.proto.LearnerSpecRequest())

    def status(self):
        return self.call("GetStatus", self.proto.StatusRequest())

    def connect(self, hello) -> Stream:
        path, decode = self._method("Connect")
        return Stream(self.channel.stream_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                                 response_deserializer=decode), self.proto.ActorMessage(hello=hello))

    def close(self) -> None:
        self.channel.close()


class Stream:
    """One Connect stream: messages sent as queued; the learner's read by a thread, and how it ended."""

    def __init__(self, connect, first):
        self._requests: queue.Queue = queue.Queue()
        self._received: queue.Queue = queue.Queue()
        self._stashed: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.ended = threading.Event()
        self._requests.put(first)
        self._call = connect(iter(self._requests.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self._call:
                self._received.put(message)
        except grpc.RpcError:
            pass
        self.code, self.details = self._call.code(), self._call.details()
        self.ended.set()
        self._received.put(None)

    def send(self, message) -> None:
        self._requests.put(message)

    def unread(self, message) -> None:
        """Put ``message`` back: the next ``next`` of its kind returns it."""
        self._stashed[message.WhichOneof("kind")].appendleft(message)

    def cancel(self) -> None:
        self._call.cancel()

    def next(self, kind: str | None = None, timeout: float = 60):
        """The next message of ``kind`` (others wait for their own ``next``); with no kind, the very next
        one received. AssertionError when the stream ends or nothing comes within ``timeout``."""
        if kind and self._stashed[kind]:
            return self._stashed[kind].popleft()
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self._received.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError(f"no {kind or 'message'} within {timeout}s") from None
            if message is None:
                self._received.put(None)
                raise AssertionError(f"the stream ended ({self.code} {self.details!r}) before a {kind or 'message'}")
            if kind is None or message.WhichOneof("kind") == kind:
                return message
            self._stashed[message.WhichOneof("kind")].append(message)

    def wait_end(self, timeout: float = 60) -> tuple[grpc.StatusCode, str]:
        assert self.ended.wait(timeout), f"the stream did not end within {timeout}s"
        return self.code, self.details


def next_policy(stream: Stream, after: int = -1) -> tuple[int, bytes]:
    """The next whole PolicyUpdate of a version above ``after``, its chunks joined: (version, payload)."""
    version, parts = None, []
    while True:
        update = stream.next("policy_update").policy_update
        if update.chunk_index == 0:
            version, parts = update.version, []
        if update.version != version or update.chunk_index != len(parts):
            continue  # the rest of a version we did not see start, or one a newer version discarded
        parts.append(update.payload)
        if len(parts) == update.chunk_count and update.version > after:
            payload = b"".join(parts)
            assert len(payload) == update.total_bytes
            return version, payload


# ---------------------------------------------------------------- payloads (the proto's `Codec`)

def encode(fields: dict[str, np.ndarray]) -> bytes:
    """A msgpack map of name -> {"dtype", "shape", "data": little-endian bytes}."""
    def array(a: np.ndarray) -> dict:
        little = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        return {"dtype": a.dtype.name, "shape": list(a.shape), "data": little.tobytes()}
    return msgpack.packb({name: array(np.asarray(a)) for name, a in fields.items()}, use_bin_type=True)


def decode(payload: bytes) -> dict[str, np.ndarray]:
    def array(item: dict) -> np.ndarray:
        dtype = np.dtype(item["dtype"]).newbyteorder("<")
        return np.frombuffer(item["data"], dtype).reshape(item["shape"]).astype(dtype.newbyteorder("="))
    return {name: array(item) for name, item in msgpack.unpackb(payload, raw=False).items()}


def tensor(message) -> np.ndarray:
    """env.proto's Tensor as an array."""
    return np.frombuffer(message.data, np.dtype(message.dtype).newbyteorder("<")).reshape(tuple(message.shape))


def field_specs(fields) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Repeated FieldSpec as {name: (dtype, shape)}."""
    return {f.name: (f.dtype, tuple(f.shape)) for f in fields}


# ---------------------------------------------------------------- the "dqn" network (docs/policy-network.md)

def leaves(space, path: tuple[str, ...] = ()):
    """(field name, leaf Space) in step 1's order: Dict entries as listed, Tuple items by index."""
    kind = space.WhichOneof("kind")
    if kind == "dict":
        for entry in space.dict.entries:
            yield from leaves(entry.space, (*path, entry.key))
    elif kind == "tuple":
        for index, item in enumerate(space.tuple.spaces):
            yield from leaves(item, (*path, str(index)))
    else:
        yield "/".join(("obs", *path)), space


def one_hot(nvec: np.ndarray, start: np.ndarray):
    """Step 2a/2b: one one-hot per element, all zeros out of range."""
    offsets = np.cumsum(nvec) - nvec

    def encode_leaf(x: np.ndarray) -> np.ndarray:
        local = x.reshape(len(x), -1).astype(np.int64) - start
        out = np.zeros((len(x), int(nvec.sum())), np.float32)
        rows, cols = np.nonzero((local >= 0) & (local < nvec))
        out[rows, offsets[cols] + local[rows, cols]] = 1
        return out
    return encode_leaf


def image_layout(shape: tuple[int, ...], dtype: str, channel_order: str):
    """Step 2c: (C, H, W, channels_last) when a Box is an image, else None."""
    if len(shape) == 2 and dtype in ("uint8", "bool"):
        (c, h, w), last = (1, *shape), True
    elif len(shape) == 3:
        last = channel_order == "hwc" or (channel_order == "auto" and shape[2] <= shape[0])
        c, h, w = (shape[2], shape[0], shape[1]) if last else shape
    else:
        return None
    return (c, h, w, last) if min(h, w) >= 4 else None


def conv(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """A cross-correlation [B, C, H, W] -> [B, O, H', W'], no padding."""
    windows = np.lib.stride_tricks.sliding_window_view(x, weight.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("bchwuv,ocuv->bohw", windows, weight, optimize=True) + bias[:, None, None]


def image(prefix: str, layout, dtype: str, state: dict[str, np.ndarray]):
    """Step 2c: scale, arrange as [C, H, W], the conv torso, flatten."""
    c, h, w, last = layout
    layers = [(0, 4), (2, 2), (4, 1)] if min(h, w) >= 36 else [(0, 1)]

    def encode_leaf(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float32) / np.float32(255) if dtype == "uint8" else x.astype(np.float32)
        x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2) if last else x
        for n, stride in layers:
            x = np.maximum(conv(x, state[f"{prefix}.{n}.weight"], state[f"{prefix}.{n}.bias"], stride), 0)
        return x.reshape(len(x), -1)
    return encode_leaf


def flat(x: np.ndarray) -> np.ndarray:
    """Step 2d."""
    return x.reshape(len(x), -1).astype(np.float32)


class QNet:
    """Observation leaves (by field name) -> Q values, one [B, size] array per action branch."""

    def __init__(self, env_spec, config: dict, state: dict[str, np.ndarray]):
        self.state, self.priority_eps = state, np.float32(config["priority_eps"])
        self.encoders = {}
        for i, (name, space) in enumerate(leaves(env_spec.observation)):
            kind = space.WhichOneof("kind")
            if kind == "discrete":
                self.encoders[name] = one_hot(np.array([space.discrete.n]), np.array([space.discrete.start]))
            elif kind == "multi_discrete":
                nvec, start = tensor(space.multi_discrete.nvec), tensor(space.multi_discrete.start)
                self.encoders[name] = one_hot(nvec.reshape(-1).astype(np.int64), start.reshape(-1).astype(np.int64))
            elif kind == "box" and (layout := image_layout(tuple(space.box.shape), space.box.dtype,
                                                           config["channel_order"])):
                self.encoders[name] = image(f"encoder.leaf_encoders.{i}.torso", layout, space.box.dtype, state)
            else:
                self.encoders[name] = flat
        self.mlp = [(state[f"encoder.mlp.{2 * k}.weight"], state[f"encoder.mlp.{2 * k}.bias"])
                    for k in range(len(config["hidden_sizes"]))]
        self.dueling = config["dueling"]
        action = env_spec.action
        kind = action.WhichOneof("kind")
        if kind == "discrete":
            self.sizes, self.starts = np.array([action.discrete.n]), np.array([action.discrete.start])
            self.shape, self.dtype = (), action.discrete.dtype or "int64"
        else:
            assert kind == "multi_discrete", f"step 5's {kind} actions are not played here"
            nvec = tensor(action.multi_discrete.nvec)
            self.sizes, self.starts = nvec.reshape(-1), tensor(action.multi_discrete.start).reshape(-1)
            self.shape, self.dtype = nvec.shape, nvec.dtype.name

    def q(self, obs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Steps 2-6."""
        h = np.concatenate([encode_leaf(obs[name]) for name, encode_leaf in self.encoders.items()], axis=1)
        for weight, bias in self.mlp:
            h = np.maximum(h @ weight.T + bias, 0)
        a = h @ self.state["head.advantages.weight"].T + self.state["head.advantages.bias"]
        branches = np.split(a, np.cumsum(self.sizes)[:-1], axis=1)
        if not self.dueling:
            return branches
        v = h @ self.state["head.value.weight"].T + self.state["head.value.bias"]
        return [v + a_d - a_d.mean(axis=1, keepdims=True) for a_d in branches]

    def greedy(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Step 8: start + argmax per branch, in the action's shape and dtype."""
        indices = np.stack([q_d.argmax(axis=1) for q_d in self.q(obs)], axis=1)
        return (indices + self.starts).astype(self.dtype).reshape(len(indices), *self.shape)

    def act(self, obs: dict[str, np.ndarray], epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """Step 9: per env, the whole action uniform at random with probability ``epsilon``."""
        actions = self.greedy(obs)
        explore = rng.random(len(actions)) < epsilon
        drawn = (rng.integers(0, self.sizes, (len(actions), len(self.sizes))) + self.starts).astype(self.dtype)
        return np.where(explore.reshape(-1, *[1] * len(self.shape)), drawn.reshape(actions.shape), actions)

    def priorities(self, obs, action: np.ndarray, reward: np.ndarray, discount: np.ndarray, next_obs) -> np.ndarray:
        """Step 10: mean over branches of |reward + discount * mean_d max Q_d(next) - Q_d(obs, action)| + eps."""
        bootstrap = np.mean([q_d.max(axis=1) for q_d in self.q(next_obs)], axis=0)
        target = reward + discount * bootstrap
        indices = action.reshape(len(action), -1) - self.starts
        taken = np.stack([q_d[np.arange(len(q_d)), indices[:, d]] for d, q_d in enumerate(self.q(obs))], axis=1)
        return (np.abs(target[:, None] - taken).mean(axis=1) + self.priority_eps).astype(np.float32)


def apex_epsilon(settings, config: dict) -> float:
    """Settings' Ape-X epsilon for this actor: i = actor_index mod N."""
    n = settings.num_actors
    if n == 1:
        return config["epsilon_base"]
    return config["epsilon_base"] ** (1 + config["epsilon_alpha"] * (settings.actor_index % n) / (n - 1))


# ---------------------------------------------------------------- playing: the proto's DQN n-step fields

class Player:
    """Envs stepped by a policy and cut into n-step transitions (obs, action, reward, discount, next_obs).

    With ``stack`` K an observation is the last K frames, oldest first, an episode's first frame repeated
    K times ("Frame-stacked batches"); it is kept as the ids of its frames, which a batch then carries once.
    """

    def __init__(self, make_env, num_envs: int, n_step: int, gamma: float, stack: int = 0):
        self.envs = [make_env() for _ in range(num_envs)]
        self.n_step, self.gamma, self.stack = n_step, np.float32(gamma), stack
        self.frames: list[np.ndarray] = []
        self.obs = [self._observe(env.reset(seed=seed)[0]) for seed, env in enumerate(self.envs)]
        self.windows = [collections.deque() for _ in self.envs]
        self.ready: list[tuple] = []

    def _observe(self, frame: np.ndarray, stack: tuple[int, ...] | None = None):
        if not self.stack:
            return frame
        self.frames.append(frame)
        new = len(self.frames) - 1
        return (new,) * self.stack if stack is None else (*stack[1:], new)

    def stacked(self, observations) -> np.ndarray:
        """Observations as the network sees them: [B, *obs] (stacks rebuilt from frame ids)."""
        if not self.stack:
            return np.stack(observations)
        return np.stack([np.stack([self.frames[i] for i in ids]) for ids in observations])

    def play(self, policy, count: int) -> list[tuple]:
        """Step every env with ``policy`` ([E, *obs] -> [E, *action]) until ``count`` transitions are ready."""
        while len(self.ready) < count:
            actions = policy(self.stacked(self.obs))
            for e, env in enumerate(self.envs):
                frame, reward, terminated, truncated, _ = env.step(actions[e])
                following = self._observe(frame, self.obs[e])
                window = self.windows[e]
                window.append((self.obs[e], actions[e], np.float32(reward)))
                if terminated or truncated:  # every window still open ends here
                    while window:
                        self._emit(window, following, terminated)
                    self.obs[e] = self._observe(env.reset()[0])
                else:
                    if len(window) == self.n_step:
                        self._emit(window, following, False)
                    self.obs[e] = following
        taken, self.ready = self.ready[:count], self.ready[count:]
        return taken

    def _emit(self, window: collections.deque, following, terminated: bool) -> None:
        """The transition of the window's first step, which leaves the window."""
        rewards = [step[2] for step in window]
        ret = np.float32(sum(self.gamma ** k * r for k, r in enumerate(rewards)))
        discount = np.float32(0) if terminated else self.gamma ** len(rewards)
        obs, action, _ = window.popleft()
        self.ready.append((obs, action, ret, discount, following))

    def fields(self, transitions: list[tuple]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """The batch payload's fields, and the obs and next_obs stacks they stand for."""
        obs, action, reward, discount, following = zip(*transitions)
        fields = {"action": np.asarray(action, np.int64), "reward": np.asarray(reward, np.float32),
                  "discount": np.asarray(discount, np.float32)}
        if not self.stack:
            fields["obs"], fields["next_obs"] = np.stack(obs), np.stack(following)
            return fields, fields["obs"], fields["next_obs"]
        used = sorted({i for ids in obs + following for i in ids})
        local = {frame: index for index, frame in enumerate(used)}
        fields["frames"] = np.stack([self.frames[i] for i in used])
        fields["obs"] = np.array([[local[i] for i in ids] for ids in obs], np.int64)
        fields["next_obs"] = np.array([[local[i] for i in ids] for ids in following], np.int64)
        return fields, fields["frames"][fields["obs"]], fields["frames"][fields["next_obs"]]
