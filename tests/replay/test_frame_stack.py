"""Frames stored once: what a replay samples equals the stacks gymnasium's FrameStackObservation built
for the same steps, across episode ends, ring wraps, frames dropping items, resends and checkpoints."""

from __future__ import annotations

import functools

import grpc
import gymnasium as gym
import numpy as np
import pytest
import torch
from custom_envs import COUNTING_ENVS, STACKED, CountingFrames, self_stacking_frames
from procs import start_learner, status, stop
from streams import RawStream

from actorlearner import specs, wire
from actorlearner.actor.frames import FrameIds, FramePending
from actorlearner.algorithms import make_spec
from actorlearner.envs import make_vector_env
from actorlearner.frames import algorithm_frames, batch_fields, frame_id_space, frame_stack_of
from actorlearner.replay import PrioritizedReplay, make_replay
from actorlearner.replay.layout import gather_rows
from actorlearner.v1 import learner_pb2 as pb

K, ENVS, N_STEP = STACKED, COUNTING_ENVS, 3
PATHS = [("cpu", "auto"), ("cpu", "torch"),
         pytest.param("cuda", "torch", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


CONFIGS = {"dqn": {"n_step": N_STEP, "gamma": 0.5}, "r2d2": {"sequence_length": 6, "overlap": 2, "burn_in": 1}}
CASES = {"dqn": ("dqn", False), "r2d2": ("r2d2", False), "dqn-env-stacks": ("dqn", True)}


def play(case: str, steps: int, batch_size: int = 8) -> tuple[list[dict], list[dict], object]:
    """The same vector-env steps assembled twice into the algorithm's items (DQN's n-step transitions,
    R2D2's overlapping sequences): over the stacked observations (the reference) and over frame ids;
    returns (algorithm, reference items, wire-decoded batches, layout). The frames are stacked by
    ``--frame-stack`` or by an env that declares it."""
    algorithm, env_stacks = CASES[case]
    if env_stacks:
        envs = make_vector_env("custom_envs:self_stacking_frames", ENVS)
    else:
        envs = make_vector_env("custom_envs:counting_frames", ENVS, frame_stack=K)
    assert frame_stack_of(envs, 0 if env_stacks else K) == K
    spec = make_spec(algorithm, envs.single_observation_space, envs.single_action_space, CONFIGS[algorithm])
    layout, by_ids = algorithm_frames(spec)
    fields = batch_fields(layout, by_ids.transition_fields())
    policy = spec.make_policy()  # R2D2's sequences carry its recurrent state: both assemblers read the same
    reference_asm, id_asm = spec.make_assembler(ENVS, policy), by_ids.make_assembler(ENVS, policy)
    frame_ids = FrameIds(ENVS, K)
    pending = FramePending(frame_ids, layout)
    obs, _ = envs.reset(seed=3)
    ids = frame_ids.observe(obs, np.ones(ENVS, bool))
    was_done = np.zeros(ENVS, bool)
    reference, batches, rng = [], [], np.random.default_rng(0)
    for _ in range(steps):
        policy.act(obs, 1.0)  # advances R2D2's memory; the actions are random either way
        actions = rng.integers(2, size=ENVS)
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        next_ids = frame_ids.observe(next_obs, was_done)
        was_done = (terminated | truncated) & ~was_done
        out = reference_asm.push(obs, actions, rewards, terminated, truncated, next_obs)
        if out is not None:
            reference.extend({k: v[i] for k, v in out.items()} for i in range(len(out["action"])))
        pending.add(id_asm.push(ids, actions, rewards, terminated, truncated, next_ids), version=0)
        if was_done.any():
            policy.reset_memory(was_done)
        while pending.ready(batch_size):
            batch, _ = pending.take(batch_size)
            payload = wire.encode_batch(batch)  # through the wire, as a learner receives it
            batches.append(wire.decode_batch(payload, wire.Codec.MSGPACK, fields, len(batch["action"])))
        obs, ids = next_obs, next_ids
    envs.close()
    return algorithm, reference, batches, layout


def stored_items(replay: PrioritizedReplay) -> list[dict]:
    """Every item the replay holds now, frames stacked, by reading its rows as a sample would."""
    slots = torch.nonzero(replay._keys >= 0).squeeze(1)
    sample = replay._sample_of_rows(gather_rows(replay._rows, slots), torch.ones(len(slots)))
    data = {k: v.cpu().numpy() for k, v in sample.data.items()}
    return [{k: v[i] for k, v in data.items()} for i in range(len(slots))]


def first_frame(item: dict) -> bytes:
    """An item's first observation's newest frame: unique per env, episode and step."""
    return item["obs"].reshape(-1, K, 3, 4)[0, -1].tobytes()


def assert_match(stored: list[dict], reference: list[dict]) -> None:
    by_first = {first_frame(item): item for item in reference}
    assert stored
    for item in stored:
        expected = by_first[first_frame(item)]
        assert item.keys() == expected.keys()
        for name in item:
            np.testing.assert_array_equal(item[name], expected[name], err_msg=name)


@functools.cache
def played_case(case: str):
    return play(case, 240)


@pytest.fixture(params=list(CASES))
def played(request):
    return played_case(request.param)


def test_the_reference_has_episode_starts_ends_and_truncations(played):
    algorithm, reference, batches, layout = played
    stacks = [stack for item in reference for stack in item["obs"].reshape(-1, K, 3, 4)]
    assert any((stack[0] == stack[-1]).all() for stack in stacks)  # stacks repeating an episode's first frame
    assert any((item["discount"] == 0).any() for item in reference) and len(batches) > 10
    # Each batch carries about one frame per env step its items hold, not their stacks.
    frames = sum(len(b[wire.FRAMES]) for b in batches)
    stacked = sum(b["obs"].size for b in batches) * (2 if "next_obs" in layout.refs else 1)
    assert frames < stacked / 2


@pytest.mark.parametrize("device,kernels", PATHS)
def test_samples_equal_the_reference_stacks_across_wraps_drops_resends_and_checkpoints(played, device, kernels):
    algorithm, reference, batches, layout = played
    steps = 3 if algorithm == "r2d2" else 1  # new frames an item brings, about

    def replay(frame_capacity: int, kind: str = kernels) -> PrioritizedReplay:
        return make_replay(50, stored_fields(algorithm), device=device, kernels=kind, frames=layout,
                                 frame_capacity=frame_capacity * steps)

    roomy, tight = replay(400), replay(60)  # tight: frames run out before items do, so items drop early
    for i, batch in enumerate(batches):
        if i == len(batches) // 2:  # a resend: the first try's write never happens, the batch comes again
            roomy.abort(roomy.reserve(batch))
        roomy.add(batch)
        tight.add(batch)
        if i == len(batches) // 2:  # a checkpoint, restored into the other kernel path, which goes on
            state = roomy.state_dict()
            roomy = replay(400, "torch" if kernels == "auto" else "auto")
            roomy.load_state_dict(state)
    assert roomy.inserted > 2 * roomy.capacity and tight.abandoned > 0  # wrapped; items dropped for their frames
    assert len(stored_items(roomy)) == roomy.capacity  # the resend's abandoned slots were overwritten since
    for buffer in (roomy, tight):
        items = stored_items(buffer)
        assert len(items) >= len(batches[-1]["action"])
        assert_match(items, reference)
    sample = roomy.sample(16)
    assert sample.data["obs"].shape[-3:] == (K, 3, 4) and sample.data["obs"].dtype == torch.uint8
    assert_match([{k: v[i].cpu().numpy() for k, v in sample.data.items()} for i in range(16)], reference)


def stored_fields(algorithm: str) -> dict:
    """What the replay stores for the algorithm's items over frame ids."""
    return make_spec(algorithm, frame_id_space(gym.spaces.Box(0, 255, (K, 3, 4), np.uint8)), gym.spaces.Discrete(2),
                     CONFIGS[algorithm]).transition_fields()


def test_a_batch_referring_outside_its_frames_is_refused_and_changes_nothing(played):
    algorithm, _, batches, layout = played
    replay = make_replay(50, stored_fields(algorithm), frames=layout, frame_capacity=1000)
    replay.add(batches[0])
    bad = dict(batches[1])
    bad["obs"] = bad["obs"].copy()
    bad["obs"].reshape(-1)[0] = len(bad[wire.FRAMES])
    with pytest.raises(ValueError, match="outside the batch's"):
        replay.add(bad)
    missing = {k: v for k, v in batches[1].items() if k != wire.FRAMES}
    with pytest.raises(ValueError, match="needs its 'frames' field"):
        replay.add(missing)
    assert replay.inserted == len(batches[0]["action"]) and replay.pending == 0
    del algorithm


def test_frame_stack_on_an_env_that_stacks_its_own_frames_is_refused():
    with pytest.raises(ValueError, match="stacks its own 4 frames"):
        frame_stack_of(self_stacking_frames(), 4)


def test_a_learner_refuses_a_batch_whose_frame_index_is_out_of_range():
    """Through a real learner process: INVALID_ARGUMENT naming the field, nothing of it stored."""
    _, _, batches, _ = played_case("dqn")
    space = gym.wrappers.FrameStackObservation(CountingFrames(0), K)
    spec = specs.env_spec("custom_envs:counting_frames", space.observation_space, space.action_space)
    learner, port = start_learner("--env", "custom_envs:counting_frames", "--frame-stack", str(K),
                                  "--dqn-n-step", str(N_STEP), "--dqn-gamma", "0.5", "--eval-every", "0")
    try:
        hello = pb.ActorMessage(hello=pb.Hello(actor_id="frames", protocol_version=wire.PROTOCOL_VERSION,
                                               algorithm="dqn", env_spec=spec, policy_version=-1))

        def message(seq: int, fields: dict) -> pb.ActorMessage:
            return pb.ActorMessage.FromString(wire.encode_batch_message(
                seq, 0, len(fields["action"]), wire.encode_batch(fields), wire.Codec.MSGPACK,
                priorities=[1.0] * len(fields["action"])))

        good = RawStream(f"127.0.0.1:{port}", hello, message(1, batches[0]))
        assert good.next("ack", 60).ack.accepted
        good.close()
        bad = dict(batches[1])
        bad["next_obs"] = bad["next_obs"].copy()
        bad["next_obs"].reshape(-1)[-1] = len(bad[wire.FRAMES]) + 5
        refused = RawStream(f"127.0.0.1:{port}", hello, message(2, bad))
        code, details = refused.wait_end(60)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "'next_obs' refers to a frame outside" in details
        assert status(port).buffer_size == len(batches[0]["action"])
    finally:
        stop(learner)


@pytest.mark.parametrize("algorithm", ["dqn", "r2d2", "sac", "td3"])
def test_every_algorithm_stores_its_observations_as_frame_ids(algorithm):
    continuous = algorithm in ("sac", "td3")
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32) if continuous else gym.spaces.Discrete(3)
    spec = make_spec(algorithm, gym.spaces.Box(0, 255, (K, 10, 12), np.uint8), action_space)
    layout, by_ids = algorithm_frames(spec)
    assert layout.stack == K and layout.frame_shape == (10, 12) and layout.frame_dtype == torch.uint8
    assert set(layout.refs) == ({"obs"} if algorithm == "r2d2" else {"obs", "next_obs"})
    stored = by_ids.transition_fields()
    for name in layout.refs:
        assert stored[name][1] == torch.int64 and stored[name][0][-1] == K
        assert spec.transition_fields()[name][0] == (*stored[name][0], 10, 12)
