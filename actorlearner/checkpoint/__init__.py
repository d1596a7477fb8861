"""Checkpoints on disk: part files (parts), crash-safe directories of them (store), RNG states (rng)."""
