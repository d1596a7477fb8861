"""actorlearner: distributed actor-learner reinforcement learning over gRPC streams."""

__version__ = "0.1.0"
