"""Data-parallel learners: real torch.distributed (gloo over loopback) between separate processes."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import LearnerConfig
from actorlearner.learner.distributed import World, choose_backend, local_device, resolve_world
from actorlearner.learner.learner import Learner
from actorlearner.trained import load_trained
from procs import (CHILD_ENV, FAST_LEARNER, fork, free_port, listening_port, run_command, start_actor, start_rank,
                   status, stop, wait_until)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "data_parallel_worker.py")
STEPS = 12  # two target syncs and two published versions (publish_every 5)


def run_world(checkpoint_dir, steps: int, tag: str, algorithm: str = "dqn") -> list[dict]:
    """Both ranks of a world of two as worker processes (data_parallel_worker.main, forked from the tests'
    zygote: procs.launch says why); what each wrote."""
    address = f"127.0.0.1:{free_port()}"
    outs = [str(checkpoint_dir.parent / f"{tag}-rank-{rank}.json") for rank in range(2)]
    procs = []
    for rank, out in enumerate(outs):
        with open(out + ".err", "w") as err:
            procs.append(fork([sys.executable, WORKER], ("data_parallel_worker", "main",
                                                         [rank, 2, address, str(checkpoint_dir), steps, out, algorithm]),
                              stdout=err, stderr=err, env=CHILD_ENV))
    for proc, out in zip(procs, outs):
        assert proc.wait(300) == 0, Path(out + ".err").read_text()[-3000:]
    results = []
    for out in outs:
        with open(out) as fh:
            results.append(json.load(fh))
    return results


@pytest.fixture(scope="module")
def first_world(tmp_path_factory):
    checkpoint_dir = tmp_path_factory.mktemp("dp") / "checkpoints"
    return checkpoint_dir, run_world(checkpoint_dir, STEPS, "first")


def test_two_ranks_hold_identical_parameters_after_every_step_and_publish_the_same_versions(first_world):
    _, (rank0, rank1) = first_world
    assert len(rank0["steps"]) == len(rank1["steps"]) == STEPS
    for step, (a, b) in enumerate(zip(rank0["steps"], rank1["steps"])):
        assert a == b, f"ranks differ after step {step + 1}"
    assert [s["version"] for s in rank0["steps"]] == [(i + 1) // 5 for i in range(STEPS)]
    assert len({s["algorithm"] for s in rank0["steps"]}) == STEPS  # every step changed the parameters
    assert rank0["saved"]["replay"] != rank1["saved"]["replay"]  # each trained on its own shard
    assert rank0["saved"]["seq_table"] == {"rank-0": 4} and rank1["saved"]["seq_table"] == {"rank-1": 4}


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_every_optimizer_of_an_algorithm_averages_its_gradients(tmp_path, algorithm):
    """SAC: actor, critic and temperature optimizers, its own noise generator; TD3: delayed actor updates."""
    rank0, rank1 = run_world(tmp_path / "checkpoints", 6, algorithm, algorithm)
    assert rank0["steps"] == rank1["steps"]
    assert len({s["algorithm"] for s in rank0["steps"]}) == 6
    assert rank0["saved"]["replay"] != rank1["saved"]["replay"]


def test_runtime_changes_that_would_part_the_ranks_are_refused(first_world):
    _, ranks = first_world
    for rank in ranks:
        assert rank["refused"] == "dqn-lr must stay the same on every data-parallel rank: not changeable while they train"


def test_a_resumed_world_restores_the_parameters_and_each_rank_its_own_shard(first_world):
    checkpoint_dir, first = first_world
    assert sorted(os.listdir(checkpoint_dir)) == ["rank-0", "rank-1"]
    resumed = run_world(checkpoint_dir, 3, "resumed")
    for before, after in zip(first, resumed):
        assert after["restored"] == before["saved"]
        assert after["restored"]["updates"] == STEPS and after["restored"]["size"] == 4 * 32
    assert resumed[0]["steps"] == resumed[1]["steps"]
    assert resumed[0]["steps"][-1]["updates"] == STEPS + 3


def test_a_world_resumes_at_the_newest_step_every_rank_has(tmp_path):
    """A save cut short on rank 1 (its newest checkpoint gone): both ranks resume at the step before, and
    rank 0 moves its newer one aside."""
    checkpoint_dir = tmp_path / "checkpoints"
    first = run_world(checkpoint_dir, 4, "first")
    run_world(checkpoint_dir, 2, "second")
    shutil.rmtree(checkpoint_dir / "rank-1" / f"ckpt-{6:012d}")
    third = run_world(checkpoint_dir, 1, "third")
    for before, after in zip(first, third):
        assert after["restored"] == before["saved"]
    kept = sorted(path.name for path in (checkpoint_dir / "rank-0").iterdir())
    assert kept == [f"ckpt-{4:012d}", f"ckpt-{5:012d}", f"ckpt-{6:012d}.ahead"]  # 5: the third world's save


def test_eval_and_export_read_a_worlds_checkpoint_dir_through_rank_0(first_world):
    checkpoint_dir, _ = first_world
    trained = load_trained(checkpoint_dir)
    assert trained.source.parent.name == "rank-0" and trained.algorithm == "dqn"


def test_a_checkpoint_of_two_ranks_refuses_a_world_of_one(first_world):
    checkpoint_dir, _ = first_world
    with pytest.raises(ValueError, match="written by 2 data-parallel learners"):
        Learner(LearnerConfig(checkpoint_dir=str(checkpoint_dir / "rank-0"), eval_every=0, device="cpu",
                              min_replay_size=64, batch_size=32))


def test_the_world_comes_from_the_options_else_from_torchrun_and_kubernetes_variables():
    assert resolve_world(0, -1, "", {}) == World(1, 0, "")
    assert resolve_world(2, 1, "10.0.0.1:29500", {}) == World(2, 1, "10.0.0.1:29500")
    torchrun = {"WORLD_SIZE": "4", "RANK": "3", "MASTER_ADDR": "learner-0.learners", "MASTER_PORT": "29500"}
    assert resolve_world(0, -1, "", torchrun) == World(4, 3, "learner-0.learners:29500")
    assert resolve_world(0, 2, "", torchrun).rank == 2  # a flag wins
    pod = {"WORLD_SIZE": "3", "HOSTNAME": "learner-2", "MASTER_ADDR": "learner-0", "MASTER_PORT": "1"}
    assert resolve_world(0, -1, "", pod).rank == 2
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        resolve_world(2, 2, "h:1", {})
    with pytest.raises(ValueError, match="needs this learner's rank"):
        resolve_world(2, -1, "h:1", {"HOSTNAME": "learner"})
    with pytest.raises(ValueError, match="needs --dist-address"):
        resolve_world(2, 0, "", {})
    with pytest.raises(ValueError, match="WORLD_SIZE must be an integer"):
        resolve_world(0, -1, "", {"WORLD_SIZE": "two"})


def test_a_learner_with_a_rank_outside_its_world_exits_2_with_one_line():
    done = run_command([sys.executable, "-m", "actorlearner", "learner", "--world-size", "2", "--rank", "2",
                        "--dist-address", "127.0.0.1:1"], timeout=120, env=CHILD_ENV)
    assert done.returncode == 2 and "cannot start the learner: rank must be in [0, 2), got 2" in done.stderr
    assert "Traceback" not in done.stderr


def test_ranks_sharing_a_host_take_the_gpu_of_their_local_rank_in_turn():
    assert local_device(torch.device("cuda"), {"LOCAL_RANK": "3"}, gpus=4) == torch.device("cuda", 3)
    assert local_device(torch.device("cuda"), {}, gpus=4) == torch.device("cuda", 0)
    assert local_device(torch.device("cuda"), {"LOCAL_RANK": "3"}, gpus=2) == torch.device("cuda", 1)  # fewer GPUs
    assert local_device(torch.device("cuda"), {"LOCAL_RANK": "1"}, gpus=1) == torch.device("cuda", 0)
    assert local_device(torch.device("cuda", 1), {"LOCAL_RANK": "3"}, gpus=4) == torch.device("cuda", 1)  # named: kept
    assert local_device(torch.device("cpu"), {"LOCAL_RANK": "3"}, gpus=0) == torch.device("cpu")


GPU_A, GPU_B = "cuda GPU-6f1c2a4e-0b7d-4f0e-9a51-3c2d1e0f9a8b", "cuda GPU-0a9b8c7d-6e5f-4a3b-8c1d-2e3f4a5b6c7d"


@pytest.mark.parametrize("devices, backend, why", [
    (["cpu", "cpu"], "gloo", ""),
    ([GPU_A, GPU_B], "nccl", ""),  # a GPU each: on one host (cuda:0, cuda:1) or one per host
    ([GPU_A, GPU_A], "gloo", "ranks 0 and 1 share GPU GPU-6f1c"),  # both on cuda:0 of a 1-GPU host
    ([GPU_A, GPU_B, GPU_A], "gloo", "ranks 0 and 2 share GPU GPU-6f1c"),  # 3 local ranks, 2 GPUs
    (["mps", "mps"], "gloo", ""),
])
def test_nccl_only_when_every_rank_has_a_gpu_of_its_own(devices, backend, why):
    chosen, reason = choose_backend(devices)
    assert chosen == backend and reason.startswith(why) and bool(reason) == bool(why)


def test_ranks_on_different_kinds_of_device_are_refused_in_one_line():
    with pytest.raises(ValueError, match="^the data-parallel ranks must train on one kind of device, "
                                         "got rank 0 on cuda, rank 1 on cpu$"):
        choose_backend([GPU_A, "cpu"])


def newest_updates(directory) -> int:
    """The update count of the newest checkpoint under ``directory``."""
    _, parts = CheckpointStore(directory).load_latest()
    return int(parts["learner"]["updates"])


def test_stopping_one_rank_stops_the_world_at_one_update_count(tmp_path):
    """SIGTERM to rank 1 only: rank 0 learns of it in the next lockstep round, and both write their final
    checkpoints at the same update count and exit 0."""
    address = f"127.0.0.1:{free_port()}"
    fast = [*FAST_LEARNER, "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "3600"]
    learners = [start_rank(rank, address, *fast) for rank in range(2)]
    actors = []
    try:
        ports = [listening_port(proc) for proc in learners]
        actors = [start_actor(port, f"rank{rank}", "--seed", str(rank)) for rank, port in enumerate(ports)]
        wait_until(lambda: all(status(port).updates >= 50 for port in ports), 120, "50 updates on both ranks")
        assert stop(learners[1]) == [0]
        assert learners[0].wait(60) == 0
    finally:
        stop(*actors, *learners)
    assert newest_updates(tmp_path / "rank-0") == newest_updates(tmp_path / "rank-1") >= 50


def test_a_killed_rank_fails_the_others_instead_of_leaving_them_waiting():
    """SIGKILL to rank 1: rank 0's next collective fails (the peer's connection is gone), so it exits 1
    (after its final checkpoint) for an orchestrator to restart the world."""
    address = f"127.0.0.1:{free_port()}"
    learners = [start_rank(rank, address, *FAST_LEARNER) for rank in range(2)]
    actors = []
    try:
        ports = [listening_port(proc) for proc in learners]
        actors = [start_actor(port, f"rank{rank}", "--seed", str(rank)) for rank, port in enumerate(ports)]
        wait_until(lambda: all(status(port).updates >= 5 for port in ports), 120, "5 updates on both ranks")
        learners[1].kill()
        assert learners[0].wait(120) == 1
    finally:
        stop(*actors, *learners)


def test_run_refuses_a_world_and_ignores_world_size_in_its_environment(tmp_path):
    refused = run_command([sys.executable, "-m", "actorlearner", "run", "--port", "0", "--world-size", "2"],
                          timeout=120, env=CHILD_ENV)
    assert refused.returncode == 2 and "run trains one learner" in refused.stderr
    done = run_command([sys.executable, "-m", "actorlearner", "run", "--port", "0", "--vector-mode", "sync",
                        "--max-seconds", "1", "--actors", "1", "--run-dir", str(tmp_path), "--no-plot"], timeout=120,
                       env={**CHILD_ENV, "WORLD_SIZE": "2", "RANK": "1"})
    assert json.loads(done.stdout.strip().splitlines()[-1])["solved"] is False, done.stderr[-2000:]
