"""Relays: serve actors as a learner does and carry them over one stream to the learner (see learner.proto, Relays)."""
