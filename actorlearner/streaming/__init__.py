"""The Connect stream's plumbing that the actor, the learner and the relay share: serving streams,
keeping one up, and fanning policy versions out. It imports none of them."""
