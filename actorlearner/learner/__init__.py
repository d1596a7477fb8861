"""Learner side: the gRPC service, the training loop, checkpoints and evaluation."""
