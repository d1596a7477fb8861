"""actorlearner: distributed actor-learner reinforcement learning over gRPC streams."""

import os

# gRPC's fork handlers run around every fork of a process that uses gRPC. With a grpc.aio server's poller busy in
# another thread they skip the parent's half, and a forked child (ffmpeg recording a video, say) could restart
# gRPC's poller and hang before it execs (seen once: "Epoll1Poller ... epoll_wait error: Bad file descriptor" in
# the child, which never started). This project never forks a process that goes on using gRPC (children are
# spawned or exec'd), so it turns them off unless the user chose otherwise; it must be set before gRPC loads.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
