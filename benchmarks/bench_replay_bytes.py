"""Replay bytes per transition with Atari frames: stacks stored whole against frames stored once.

Runs the real data path on Atari-sized frames (84x84 uint8, 4 stacked, as ``--frame-stack 4``
gives): a vector env of random frames, the actor's frame ids and per-env batches, DQN's n-step
transitions or R2D2's overlapping sequences assembled over ids, each batch through the wire into
a replay that keeps frames once. Counts what the replay holds per collected env step: an item's row
plus the frames it stored per item, each frame row once, over the env steps an item stands for
(one for a transition, about T - overlap for a sequence).
Baseline, the same items stored whole (each observation its 4 frames; a transition both its
observation and the next): the bytes of the algorithm's fields over the stacked space. Ratio:
whole / once (above 1: frames once take less). Also: a 1M-transition DQN replay's allocation.

    python benchmarks/bench_replay_bytes.py --steps 4000 --envs 4
"""

from __future__ import annotations

import argparse
import json
import math

import gymnasium as gym
import numpy as np
import torch

from actorlearner import wire
from actorlearner.actor.frames import FrameIds, FramePending
from actorlearner.algorithms import make_spec
from actorlearner.frames import algorithm_frames, batch_fields, default_frame_capacity
from actorlearner.replay import make_replay
from actorlearner.replay.layout import KEY, VERSION, row_layout

FRAME, K = (84, 84), 4
CONFIGS = {"dqn": {"n_step": 3}, "r2d2": {"sequence_length": 80, "overlap": 40, "burn_in": 0}}


class RandomFrames(gym.Env):
    """Atari-sized random frames; episodes of ``length`` steps."""

    observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    action_space = gym.spaces.Discrete(6)
    length = 800

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.steps += 1
        return self.observation_space.sample(), 0.0, self.steps == self.length, False, {}


def row_bytes(fields: dict) -> int:
    """Bytes of one replay row of ``fields`` (with its key and version, padded as the replay pads)."""
    return row_layout({**fields, KEY: ((), torch.long), VERSION: ((), torch.long)})[1]


def measure(algorithm: str, steps: int, envs: int, batch_size: int) -> dict:
    vector = gym.vector.SyncVectorEnv([lambda: gym.wrappers.FrameStackObservation(RandomFrames(), K)] * envs)
    spec = make_spec(algorithm, vector.single_observation_space, vector.single_action_space, CONFIGS[algorithm])
    layout, by_ids = algorithm_frames(spec)
    stored = by_ids.transition_fields()
    policy = spec.make_policy() if algorithm == "r2d2" else None  # R2D2's sequences carry its recurrent state
    replay = make_replay(100_000, stored, frames=layout, frame_capacity=1_000_000)
    assembler, frame_ids = by_ids.make_assembler(envs, policy), FrameIds(envs, K)
    pending = FramePending(frame_ids, layout)
    fields = batch_fields(layout, stored)
    obs, _ = vector.reset(seed=0)
    ids, was_done, collected = frame_ids.observe(obs, np.ones(envs, bool)), np.zeros(envs, bool), 0
    for _ in range(steps):
        if policy is not None:
            policy.act(obs, 1.0)
        next_obs, rewards, terminated, truncated, _ = vector.step(vector.action_space.sample())
        collected += int((~was_done).sum())
        next_ids = frame_ids.observe(next_obs, was_done)
        pending.add(assembler.push(ids, np.zeros(envs, np.int64), rewards, terminated, truncated, next_ids), 0)
        while pending.ready(batch_size):
            batch, _ = pending.take(batch_size)
            n = len(batch["action"])
            replay.add(wire.decode_batch(wire.encode_batch(batch), wire.Codec.MSGPACK, fields, n))
        if policy is not None and was_done.any():
            policy.reset_memory(was_done)
        was_done = (terminated | truncated) & ~was_done
        obs, ids = next_obs, next_ids
    vector.close()
    store = replay._frame_ring.store
    items = replay.inserted
    steps_per_item = collected / items  # 1 for transitions; T - overlap for sequences, about
    frame_row = store._rows.shape[1]
    once = (replay._rows.shape[1] + store.inserted / items * frame_row) / steps_per_item
    whole = row_bytes(spec.transition_fields()) / steps_per_item
    scalars = sum(math.prod(shape) * dtype.itemsize for name, (shape, dtype) in stored.items() if name not in layout.refs)
    one_frame = math.prod(FRAME) + scalars / steps_per_item  # a frame per env step, and the item's other fields
    return {"algorithm": algorithm, "items": items, "env_steps": collected,
            "frames_per_item": round(store.inserted / items, 3), "bytes_once": round(once),
            "bytes_whole": round(whole), "ratio": round(whole / once, 2),
            "once_per_one_frame_and_scalars": round(once / one_frame, 3)}


def million_transition_replay() -> dict:
    """The allocation of a 1M-transition DQN replay of Atari frames, at the default frame capacity."""
    space = gym.spaces.Box(0, 255, (K, *FRAME), np.uint8)
    layout, by_ids = algorithm_frames(make_spec("dqn", space, gym.spaces.Discrete(6)))
    stored, capacity = by_ids.transition_fields(), 1_000_000
    frames = default_frame_capacity(layout, stored, capacity)
    tree = 2 * 8 * 16 / 15  # a sum and a min per leaf, float64, and the inner levels of a 16-wide tree
    total = capacity * (row_bytes(stored) + tree) + frames * (row_bytes({"frame": (FRAME, torch.uint8)}) + tree)
    whole = capacity * (row_bytes(make_spec("dqn", space, gym.spaces.Discrete(6)).transition_fields()) + tree)
    return {"capacity": capacity, "frame_capacity": frames, "gb_once": round(total / 1e9, 2),
            "gb_whole": round(whole / 1e9, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4000, help="vector env steps per layout")
    parser.add_argument("--envs", type=int, default=4, help="envs in the vector env")
    parser.add_argument("--batch-size", type=int, default=64, help="items per batch (the learner's actor_batch_size)")
    args = parser.parse_args()
    rows = [measure("dqn", args.steps, args.envs, args.batch_size),
            measure("r2d2", args.steps, args.envs, max(1, args.batch_size // 16))]
    for row in rows:
        print(f"{row['algorithm']}: {row['bytes_once']:,} B per env step with frames once against "
              f"{row['bytes_whole']:,} B whole (x{row['ratio']}); {row['frames_per_item']} frames per item; "
              f"{row['once_per_one_frame_and_scalars']}x one frame and its scalars")
    big = million_transition_replay()
    print(f"1M DQN transitions: {big['gb_once']} GB with frames once ({big['frame_capacity']:,} frames), "
          f"{big['gb_whole']} GB whole")
    print(json.dumps({"steps": args.steps, "envs": args.envs, "rows": rows, "million": big}))


if __name__ == "__main__":
    main()
