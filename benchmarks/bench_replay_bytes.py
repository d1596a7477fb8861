"""Replay bytes per environment step: R2D2's sequence items against DQN's n-step transitions.

Counts the bytes each layout's replay items hold (`transition_fields`: every field, its
shape and dtype) for an Atari-sized image observation (84x84x4 uint8) and a small vector
one, and divides by the environment steps the items stand for, two ways:

- per step slot: a sequence of T steps stores T + 1 observations (each once, no separate
  next observation) plus its actions, rewards, discounts, mask and stored state;
- per collected step: consecutive sequences share ``overlap`` steps, so each collected
  step is stored (T / (T - overlap)) times over, each sequence's bytes over its T - overlap
  new steps.

A transition holds one collected step in one slot. Ratios are transition bytes / sequence
bytes (above 1: the sequences take less).

    python benchmarks/bench_replay_bytes.py --length 80 --overlap 40
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

from actorlearner.algorithms import make_spec

SPACES = {
    "image 84x84x4 uint8": gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
    "vector 4 float32": gym.spaces.Box(-1, 1, (4,), np.float32),
}


def item_bytes(algorithm) -> int:
    """Bytes of one replay item of ``algorithm``'s layout."""
    return sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
               for shape, dtype in algorithm.transition_fields().values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=80, help="R2D2 sequence length T")
    parser.add_argument("--overlap", type=int, default=40, help="steps consecutive sequences share")
    args = parser.parse_args()
    rows = []
    for label, space in SPACES.items():
        dqn = make_spec("dqn", space, gym.spaces.Discrete(6))
        r2d2 = make_spec("r2d2", space, gym.spaces.Discrete(6),
                         {"sequence_length": args.length, "overlap": args.overlap, "burn_in": 0})
        transition, sequence = item_bytes(dqn), item_bytes(r2d2)
        per_slot = sequence / args.length
        per_collected = sequence / (args.length - args.overlap)
        rows.append({"observation": label, "transition_bytes": transition, "sequence_bytes": sequence,
                     "sequence_bytes_per_slot": round(per_slot, 1), "sequence_bytes_per_collected_step":
                     round(per_collected, 1), "ratio_per_slot": round(transition / per_slot, 3),
                     "ratio_per_collected_step": round(transition / per_collected, 3)})
    for row in rows:
        print(f"{row['observation']}: transition {row['transition_bytes']} B; sequence {row['sequence_bytes']} B = "
              f"{row['sequence_bytes_per_slot']} B per slot (x{row['ratio_per_slot']}), "
              f"{row['sequence_bytes_per_collected_step']} B per collected step (x{row['ratio_per_collected_step']})")
    print(json.dumps({"length": args.length, "overlap": args.overlap, "rows": rows}))


if __name__ == "__main__":
    main()
