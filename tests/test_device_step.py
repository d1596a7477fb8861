"""The device path reads nothing back to the host: the replay's sample and priority update, and a whole
learner step for every algorithm, run on the CPU through the same code CUDA captures; runtime changes
reach the next step; on CUDA the step is captured in a graph."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorlearner.algorithms import make_spec
from actorlearner.host_reads import HostReads
from actorlearner.learner.step import LearnerStep
from actorlearner.replay import PrioritizedReplay

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))]
CARTPOLE = (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2))
HALFCHEETAH = (gym.spaces.Box(-1, 1, (17,), np.float32), gym.spaces.Box(-1, 1, (6,), np.float32))
ALGORITHMS = {"dqn": CARTPOLE, "r2d2": CARTPOLE, "sac": HALFCHEETAH, "td3": HALFCHEETAH}


def random_items(fields, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Items of the given fields: actions and other ints in {0, 1}, flags random, floats in [0, 1)."""
    out = {}
    for name, (shape, dtype) in fields.items():
        if dtype == torch.bool:
            out[name] = rng.random((n, *shape)) < 0.9
        elif dtype.is_floating_point:
            out[name] = rng.random((n, *shape)).astype(np.float32)
        else:
            out[name] = rng.integers(0, 2, (n, *shape)).astype(torch.empty(0, dtype=dtype).numpy().dtype)
    return out


def filled_replay(fields, device: str, n: int = 512, versions: int = 4) -> PrioritizedReplay:
    replay = PrioritizedReplay(1024, fields, device=device, kernels="torch")
    rng = np.random.default_rng(0)
    for version in range(versions):
        replay.add(random_items(fields, n // versions, rng), priorities=rng.random(n // versions) + 0.1,
                   policy_version=version)
    return replay


def make_step(name: str, device: str, batch_size: int = 32, **config) -> LearnerStep:
    spec = make_spec(name, *ALGORITHMS[name], config or None)
    trainer = spec.make_trainer(device=device, seed=0)
    return LearnerStep(trainer, filled_replay(spec.transition_fields(), device), batch_size)


def test_the_check_sees_each_kind_of_host_read():
    t = torch.arange(6.0)
    reads = [lambda: t[0].item(), lambda: t.tolist(), lambda: bool(t[1] > 0), lambda: float(t[2]), lambda: t.numpy(),
             lambda: t[t > 2], lambda: torch.nonzero(t), lambda: t.unique(), lambda: int(t[3])]
    for read in reads:
        with HostReads("cpu") as counted:
            read()
        assert sum(counted.counts.values()) == 1, counted.counts
    with HostReads("cpu") as counted:
        torch.where(t > 2, t, 0.0).cumsum(0).index_select(0, torch.tensor([1, 2]))
    assert not counted.counts


@pytest.mark.parametrize("device", DEVICES)
def test_replay_sample_update_and_insert_read_nothing_on_the_host(device):
    fields = {"obs": ((4,), torch.float32), "action": ((), torch.int64)}
    replay = filled_replay(fields, device)
    rng = np.random.default_rng(1)
    inserts = [random_items(fields, 16, rng) for _ in range(5)]
    with HostReads(device) as counted:
        for min_version, items in zip((None, None, 2, 2, 3), inserts):
            sample = replay.sample(64, min_policy_version=min_version)
            replay.update_priorities(sample.indices, torch.rand(64, device=device))
            replay.add(items, priorities=rng.random(16), policy_version=4)
    assert not counted.counts, f"host reads in the replay's device path: {dict(counted.counts)}"
    assert int(sample.policy_version.min()) >= 3  # the eviction held without a read
    replay.check_errors()


@pytest.mark.parametrize("device", DEVICES)
def test_an_invalid_priority_from_the_device_is_refused_whole_and_raised_at_the_next_read(device):
    replay = filled_replay({"obs": ((4,), torch.float32)}, device)
    before = replay._tree.leaves.clone()
    sample = replay.sample(8)
    bad = torch.full((8,), 2.0, device=device)
    bad[3] = float("nan")
    with HostReads(device) as counted:
        replay.update_priorities(sample.indices, bad)
    assert not counted.counts and torch.equal(replay._tree.leaves, before)
    with pytest.raises(ValueError, match="NaN"):
        replay.check_errors()
    replay.check_errors()  # told once


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_learner_step_reads_nothing_on_the_host_between_metric_reads(name, device):
    step = make_step(name, device)
    assert step(), "the first step (lazy optimizer state) ran"
    with HostReads(device) as counted:
        for _ in range(6):  # TD3 takes both of its phases
            assert step(min_policy_version=1)
    assert not counted.counts, f"{name}: host reads in a learner step: {dict(counted.counts)}"
    with HostReads(device) as counted:
        metrics = step.read_metrics()
    assert sum(counted.counts.values()) <= 2  # the metric sums, and the replay's refusals
    assert metrics and all(np.isfinite(value) for value in metrics.values()), metrics
    assert step.read_metrics() == {}  # nothing since


@pytest.mark.parametrize("device", DEVICES)
def test_runtime_changes_reach_the_very_next_step(device):
    step = make_step("dqn", device)
    trainer, replay = step.trainer, step.replay
    for _ in range(4):  # on CUDA: warmed up and captured
        step()
    trainer.retune(trainer.config.__class__(**{**vars(trainer.config), "lr": 1e-12, "priority_eps": 100.0}))
    weights = [p.detach().clone() for p in trainer.online.parameters()]
    leaves = replay._tree.leaves.clone()
    step()
    changed = replay._tree.leaves != leaves
    assert changed.any() and torch.all(replay._tree.leaves[changed] >= 100.0 ** replay.alpha)  # new priority_eps
    assert all(torch.allclose(p, w, rtol=0, atol=1e-6) for p, w in zip(trainer.online.parameters(), weights))
    replay.set_exponents(alpha=0.0, beta=1.0)  # every stored priority becomes 1
    step()
    assert torch.all(replay._tree.leaves[replay._keys >= 0] == 1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_on_cuda_every_phase_of_the_step_is_captured_and_replayed(name):
    step = make_step(name, "cuda")
    assert step.capture
    for _ in range(12):
        assert step()
    assert step.capture and step._graphs and all(isinstance(entry, torch.cuda.CUDAGraph) for entry in step._graphs.values())
    assert all(np.isfinite(value) for value in step.read_metrics().values())


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_with_nothing_recent_enough_says_so_and_changes_nothing(device):
    step = make_step("dqn", device)
    leaves = step.replay._tree.leaves.clone()
    assert not step(min_policy_version=100)  # every item is older: the caller waits for fresh ones
    assert torch.equal(step.replay._tree.leaves, torch.zeros_like(leaves)) and step.read_metrics() == {}
    step.replay.add(random_items(step.replay.fields, 64, np.random.default_rng(2)), policy_version=100)
    assert step(min_policy_version=100)
    assert step.read_metrics()


def test_metric_sums_keep_eager_steps_fold_them_and_add_a_captured_steps_on_the_device():
    from actorlearner.learner.step import MetricSums

    sums = MetricSums()
    sums.add({"loss": torch.tensor(1.0), "q": torch.tensor(4.0), "lr": 0.5})
    sums.add({"loss": torch.tensor(3.0), "q": torch.tensor(8.0), "lr": 0.5})
    add_on_device = sums.adder(("q", "loss"))  # folds the kept ones first; what a captured step records
    with HostReads("cpu") as counted:
        add_on_device({"loss": torch.tensor(5.0), "q": torch.tensor(0.0)})
        sums.count += 1
        sums.add({"loss": torch.tensor(7.0), "q": torch.tensor(4.0)})
    assert not counted.counts
    with HostReads("cpu") as counted:
        means = sums.read()
    assert sum(counted.counts.values()) == 1
    assert means == {"loss": 4.0, "q": 4.0, "lr": 0.25}
    assert sums.read() == {}
    with pytest.raises(ValueError, match="never added eagerly"):
        sums.adder(("entropy",))
