"""Frames stored once: what a replay samples equals the stacks gymnasium's FrameStackObservation built
for the same steps, across episode ends, ring wraps, frames dropping items, resends and checkpoints."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorlearner import wire
from actorlearner.actor.frames import FrameIds, FramePending
from actorlearner.algorithms import make_spec
from actorlearner.envs import make_vector_env
from actorlearner.frames import algorithm_frames, batch_fields, frame_id_space
from actorlearner.replay import PrioritizedReplay
from actorlearner.replay.layout import gather_rows

K, ENVS, N_STEP = 4, 3, 3
PATHS = [("cpu", "auto"), ("cpu", "torch"),
         pytest.param("cuda", "torch", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


class CountingFrames(gym.Env):
    """Frames that say which env, episode and step they are ([env, episode, step] in a 3x4 image); episodes
    of 1 to 12 steps, ending by termination or truncation."""

    observation_space = gym.spaces.Box(0, 255, (3, 4), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index: int):
        self.index, self.episode = index, -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.steps, self.length = 0, int(self.np_random.integers(1, 13))
        return self._frame(), {}

    def step(self, action):
        self.steps += 1
        end = self.steps == self.length
        truncated = end and self.episode % 2 == 1
        return self._frame(), float(self.steps), end and not truncated, truncated, {}

    def _frame(self) -> np.ndarray:
        frame = np.zeros((3, 4), np.uint8)
        frame[:, 0], frame[:, 1], frame[:, 2] = self.index, self.episode % 256, self.steps
        return frame


_made = iter(range(1000))


def counting_frames() -> gym.Env:
    return CountingFrames(next(_made) % ENVS)


def play(steps: int, batch_size: int = 8) -> tuple[list[dict], list[dict], object]:
    """The same vector-env steps assembled twice into n-step transitions: over the stacked observations
    (the reference) and over frame ids; returns (reference transitions, wire-decoded batches, layout)."""
    envs = make_vector_env("test_frame_stack:counting_frames", ENVS, frame_stack=K)
    spec = make_spec("dqn", envs.single_observation_space, envs.single_action_space, {"n_step": N_STEP, "gamma": 0.5})
    layout, by_ids = algorithm_frames(spec)
    fields = batch_fields(layout, by_ids.transition_fields())
    reference_asm, id_asm = spec.make_assembler(ENVS, None), by_ids.make_assembler(ENVS, None)
    frame_ids = FrameIds(ENVS, K)
    pending = FramePending(frame_ids, layout)
    obs, _ = envs.reset(seed=3)
    ids = frame_ids.observe(obs, np.ones(ENVS, bool))
    was_done = np.zeros(ENVS, bool)
    reference, batches, rng = [], [], np.random.default_rng(0)
    for _ in range(steps):
        actions = rng.integers(2, size=ENVS)
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        next_ids = frame_ids.observe(next_obs, was_done)
        was_done = (terminated | truncated) & ~was_done
        out = reference_asm.push(obs, actions, rewards, terminated, truncated, next_obs)
        if out is not None:
            reference.extend({k: v[i] for k, v in out.items()} for i in range(len(out["action"])))
        pending.add(id_asm.push(ids, actions, rewards, terminated, truncated, next_ids), version=0)
        while pending.ready(batch_size):
            batch, _ = pending.take(batch_size)
            payload = wire.encode_batch(batch)  # through the wire, as a learner receives it
            batches.append(wire.decode_batch(payload, wire.Codec.MSGPACK, fields, len(batch["action"])))
        obs, ids = next_obs, next_ids
    envs.close()
    return reference, batches, layout


def stored_items(replay: PrioritizedReplay) -> list[dict]:
    """Every item the replay holds now, frames stacked, by reading its rows as a sample would."""
    slots = torch.nonzero(replay._keys >= 0).squeeze(1)
    sample = replay._sample_of_rows(gather_rows(replay._rows, slots), torch.ones(len(slots)))
    data = {k: v.cpu().numpy() for k, v in sample.data.items()}
    return [{k: v[i] for k, v in data.items()} for i in range(len(slots))]


def by_first_frame(items: list[dict]) -> dict[bytes, dict]:
    """Items keyed by their observation's newest frame (unique per env, episode and step)."""
    return {item["obs"][-1].tobytes(): item for item in items}


def assert_match(stored: list[dict], reference: dict[bytes, dict]) -> None:
    assert stored
    for item in stored:
        expected = reference[item["obs"][-1].tobytes()]
        for name in ("obs", "next_obs", "action", "reward", "discount"):
            np.testing.assert_array_equal(item[name], expected[name], err_msg=name)


@pytest.fixture(scope="module")
def played():
    return play(240)


def test_the_reference_has_episode_starts_ends_and_truncations(played):
    reference, batches, layout = played
    starts = [t for t in reference if (t["obs"][0] == t["obs"][-1]).all()]  # stacks repeating the first frame
    assert starts and any(t["discount"] == 0 for t in reference) and len(batches) > 20
    # Each batch carries about one frame per item: its env's steps, not 2 K stacks.
    frames = sum(len(b[wire.FRAMES]) for b in batches)
    items = sum(len(b["action"]) for b in batches)
    assert frames < 2 * items < 2 * K * items


@pytest.mark.parametrize("device,kernels", PATHS)
def test_samples_equal_the_reference_stacks_across_wraps_drops_resends_and_checkpoints(played, device, kernels):
    reference, batches, layout = played
    by_obs = by_first_frame(reference)

    def replay(frame_capacity: int, kind: str = kernels) -> PrioritizedReplay:
        return PrioritizedReplay(50, stored_fields(), device=device, kernels=kind, frames=layout,
                                 frame_capacity=frame_capacity)

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
    assert roomy.inserted > 2 * roomy.capacity and tight.abandoned > roomy.abandoned  # wrapped; dropped for frames
    assert len(stored_items(roomy)) == roomy.capacity  # the resend's abandoned slots were overwritten since
    for buffer in (roomy, tight):
        items = stored_items(buffer)
        assert len(items) >= len(batches[-1]["action"])
        assert_match(items, by_obs)
    sample = roomy.sample(16)
    assert sample.data["obs"].shape == (16, K, 3, 4) and sample.data["obs"].dtype == torch.uint8
    assert_match([{k: v[i].cpu().numpy() for k, v in sample.data.items()} for i in range(16)], by_obs)


def stored_fields() -> dict:
    """What the replay stores for DQN's n-step transitions over frame ids."""
    return make_spec("dqn", frame_id_space(gym.spaces.Box(0, 255, (K, 3, 4), np.uint8)), gym.spaces.Discrete(2),
                     {"n_step": N_STEP, "gamma": 0.5}).transition_fields()


def test_a_batch_referring_outside_its_frames_is_refused_and_changes_nothing(played):
    _, batches, layout = played
    replay = PrioritizedReplay(50, stored_fields(), frames=layout, frame_capacity=100)
    replay.add(batches[0])
    bad = dict(batches[1])
    bad["obs"] = bad["obs"].copy()
    bad["obs"][0, 0] = len(bad[wire.FRAMES])
    with pytest.raises(ValueError, match="outside the batch's"):
        replay.add(bad)
    missing = {k: v for k, v in batches[1].items() if k != wire.FRAMES}
    with pytest.raises(ValueError, match="needs its 'frames' field"):
        replay.add(missing)
    assert replay.inserted == len(batches[0]["action"]) and replay.pending == 0
