"""Runtime parameters: ``actorlearner set`` changes a running learner and its actors, all or nothing,
and the changes survive a checkpoint and resume."""

from __future__ import annotations

import subprocess
import sys
import threading

import grpc
import numpy as np
import pytest
import torch
from procs import CHILD_ENV, wait_until
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from actorlearner.actor.actor import Actor
from actorlearner.cli import main
from actorlearner.config import ActorConfig, LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.parameters import ParameterError
from actorlearner.learner.server import serve
from actorlearner.replay import RateLimiter, make_replay
from actorlearner.transport import SecurityConfig
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

TOKEN = "runtime-parameters-token"


def learner_config(tmp_path, **overrides) -> LearnerConfig:
    values = dict(env="CartPole-v1", replay_capacity=20_000, min_replay_size=256, batch_size=64, publish_every=5,
                  eval_every=0, checkpoint_dir=str(tmp_path / "checkpoints"), logdir=str(tmp_path / "tb"),
                  security=SecurityConfig(auth_token=TOKEN),
                  algorithm_config={"hidden_sizes": (32, 32), "epsilon_base": 0.4})
    return LearnerConfig(**{**values, **overrides})


def set_cli(port: int, *assignments: str, token: str = TOKEN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actorlearner", "set", "--learner", f"127.0.0.1:{port}",
                           "--auth-token", token, *assignments], capture_output=True, text=True, timeout=60,
                          env=CHILD_ENV)


def set_in_process(port: int, *assignments: str, capsys) -> tuple[int, str]:
    """`actorlearner set` through the CLI's own entry point in this process: (exit code, stderr)."""
    code = main(["set", "--learner", f"127.0.0.1:{port}", "--auth-token", TOKEN, *assignments])
    return code, capsys.readouterr().err


def tunable_state(learner: Learner) -> tuple:
    """Everything a SetParameters request may change (a tensor lr, as on CUDA, read as its value)."""
    return (learner.config, learner.algorithm_config, learner.trainer.config,
            [float(g["lr"]) for g in learner.trainer.optimizer.param_groups], learner.replay.limiter.samples_per_insert,
            learner.replay.limiter.diff, learner.replay.buffer.alpha, learner.replay.buffer.beta0, dict(learner.changed_parameters),
            learner.settings_version, learner.spec().algorithm_config)


def test_set_changes_lr_and_epsilon_on_a_running_learner_and_its_actor_and_they_survive_a_resume(tmp_path):
    learner = Learner(learner_config(tmp_path))
    learner.start()
    with serve(learner, "127.0.0.1", 0) as port:
        actor = Actor(ActorConfig(learner=f"127.0.0.1:{port}", actor_id="tuned", num_envs=2, reconnect_max=1.0,
                                  security=SecurityConfig(auth_token=TOKEN)))
        runner = threading.Thread(target=actor.run, daemon=True)
        runner.start()
        try:
            wait_until(lambda: actor.policy_version >= 0 and learner.updates > 0, 120, "the actor streaming, training")
            network, assembler, welcomes = actor.policy, actor.assembler, actor.link.welcomes
            assert actor.exploration == pytest.approx(0.4)

            done = set_cli(port, "dqn-lr=1e-4", "dqn-epsilon-base=0.05", "samples-per-insert=4")
            assert done.returncode == 0, done.stderr[-2000:]
            assert "dqn-lr: 0.0005 -> 0.0001" in done.stdout and "dqn-epsilon-base: 0.4 -> 0.05" in done.stdout

            assert [g["lr"] for g in learner.trainer.optimizer.param_groups] == [1e-4]
            assert learner.replay.limiter.samples_per_insert == 4.0
            wait_until(lambda: actor.exploration == pytest.approx(0.05), 60, "the actor's new epsilon")
            # Only runtime options changed: the same stream, network, weights and n-step episodes.
            assert actor.link.welcomes == welcomes + 1 and actor.link.reconnects == 0
            assert actor.policy is network and actor.assembler is assembler and actor.policy_version >= 0
            assert actor.policy.config.epsilon_base == 0.05
            inserted = learner.ingestion.inserted_batches
            wait_until(lambda: learner.ingestion.inserted_batches > inserted + 2, 60, "batches after the change")

            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.LearnerStub(channel)
                status = stub.GetStatus(pb.StatusRequest(), metadata=[("authorization", f"Bearer {TOKEN}")], timeout=10)
            assert {p.name: p.value for p in status.changed_parameters} == {
                "dqn-lr": "0.0001", "dqn-epsilon-base": "0.05", "samples-per-insert": "4.0"}
            assert {p.name: p.value for p in status.parameters}["dqn-lr"] == "0.0001"
            assert actor.link.error is None and runner.is_alive()
        finally:
            actor.stop()
            runner.join(30)
            learner.stop()  # the final checkpoint
    assert not runner.is_alive()

    tags = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0}).Reload().Tags()["tensors"]
    assert any(tag.startswith("runtime_parameters") for tag in tags), tags

    resumed = Learner(learner_config(tmp_path))  # started with the original flags: the changes win
    assert [g["lr"] for g in resumed.trainer.optimizer.param_groups] == [1e-4]
    assert resumed.trainer.config.epsilon_base == 0.05 and resumed.replay.limiter.samples_per_insert == 4.0
    assert resumed.changed_parameters == {"dqn-lr": "0.0001", "dqn-epsilon-base": "0.05", "samples-per-insert": "4.0"}
    assert '"epsilon_base": 0.05' in resumed.spec().algorithm_config
    assert resumed.replay.limiter.diff == pytest.approx(learner.replay.limiter.diff
                                                 - (learner.replay.limiter.inserts - resumed.replay.limiter.inserts) * 4.0)
    resumed.progress.telemetry.close()


def test_a_bad_name_or_value_is_refused_with_the_reason_and_nothing_changes(tmp_path, capsys):
    learner = Learner(learner_config(tmp_path, checkpoint_dir="", logdir=""))
    with serve(learner, "127.0.0.1", 0) as port:
        before = tunable_state(learner)
        refusals = {
            ("no-such-thing=1",): "is not a parameter",
            ("dqn-n-step=2",): "is fixed while training runs",
            ("dqn-lr=fast",): "could not convert",
            ("dqn-lr=-1",): "lr must be > 0",
            ("dqn-lr=1e-4", "beta=2"): "beta must be in [0, 1]",  # the valid lr is not applied either
            ("dqn-lr=1e-4", "samples-per-insert=1e9"): "samples-per-insert must be <= rate-error-buffer",
            ("alpha=nan",): "not a finite number",
            ("dqn-lr=1e-4", "dqn_lr=2e-4"): "named more than once",
        }
        for assignments, reason in refusals.items():
            code, stderr = set_in_process(port, *assignments, capsys=capsys)
            assert code == 1 and "INVALID_ARGUMENT" in stderr and reason in stderr, (assignments, stderr[-1000:])
            assert tunable_state(learner) == before, assignments
        wrong_token = set_cli(port, "dqn-lr=1e-4", token="not-the-token")  # the command as a process, once
        assert wrong_token.returncode == 1 and "UNAUTHENTICATED" in wrong_token.stderr
        assert tunable_state(learner) == before
    learner.stop()


def test_learner_side_parameters_take_effect_at_once(tmp_path):
    learner = Learner(learner_config(tmp_path, checkpoint_dir="", logdir=""))
    changes = learner.set_parameters([("alpha", "0.3"), ("beta", "0.7"), ("publish-every", "3"),
                                      ("max-policy-lag", "4"), ("dqn-target-update-period", "7")])
    assert [(c.name, c.previous, c.value) for c in changes] == [
        ("alpha", "0.6", "0.3"), ("beta", "0.4", "0.7"), ("publish-every", "5", "3"), ("max-policy-lag", "0", "4"),
        ("dqn-target-update-period", "250", "7")]
    assert (learner.replay.buffer.alpha, learner.replay.buffer.beta0) == (0.3, 0.7)
    assert (learner.config.publish_every, learner.config.max_policy_lag) == (3, 4)
    assert learner.trainer.config.target_update_period == 7
    with pytest.raises(ParameterError):
        learner.set_parameters([])
    learner.stop()


def test_a_new_ratio_keeps_the_limiters_balance_and_its_state_round_trips():
    limiter = RateLimiter(min_size_to_sample=10, samples_per_insert=8.0, error_buffer=100.0)
    assert limiter.acquire_insert(40, timeout=0) and limiter.acquire_sample(200, timeout=0)
    middle = limiter.min_size_to_sample * limiter.samples_per_insert
    off_middle = limiter.diff - middle
    limiter.retarget(2.0)
    assert limiter.diff - limiter.min_size_to_sample * 2.0 == pytest.approx(off_middle)
    assert (limiter.min_diff, limiter.max_diff) == (20.0 - 100.0, 20.0 + 100.0)
    assert limiter.acquire_insert(1, timeout=0) and limiter.diff == pytest.approx(20.0 + off_middle + 2.0)
    restored = RateLimiter(min_size_to_sample=10, samples_per_insert=2.0, error_buffer=100.0)
    restored.load_state_dict(limiter.state_dict())
    assert restored.diff == limiter.diff
    with pytest.raises(ValueError, match="error_buffer"):
        limiter.retarget(500.0)
    assert limiter.samples_per_insert == 2.0


def test_a_new_alpha_reraises_every_stored_priority_and_leaves_empty_slots_empty(fast_replay_path):
    replay = make_replay(64, {"x": ((), torch.float32)}, alpha=0.5, eps=0.0, **fast_replay_path)
    priorities = torch.arange(1, 11, dtype=torch.float64)
    replay.add({"x": torch.arange(10.0)}, priorities=priorities)
    replay.set_exponents(1.0, 0.9)
    assert replay.beta0 == 0.9
    indices = np.concatenate([replay.sample(8).indices.cpu().numpy() for _ in range(1500)])
    counts = np.bincount(indices, minlength=64)
    assert counts[10:].sum() == 0  # never an empty slot
    expected = priorities.numpy() / priorities.sum().item()  # proportional to p ** 1 now
    assert np.abs(counts[:10] / counts.sum() - expected).max() < 0.02
    replay.set_exponents(0.0, 0.9)  # every stored priority becomes 1: uniform
    counts = np.bincount(np.concatenate([replay.sample(8).indices.cpu().numpy() for _ in range(1500)]), minlength=64)
    assert counts[10:].sum() == 0 and np.abs(counts[:10] / counts.sum() - 0.1).max() < 0.02
