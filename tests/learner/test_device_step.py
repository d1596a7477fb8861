"""The device path reads nothing back to the host: the replay's sample and priority update, and a whole
learner step for every algorithm, run on the CPU through the same code CUDA captures; runtime changes
reach the next step; on CUDA the step is captured in a graph."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import INTERPRETING_TRITON

from actorlearner.algorithms import make_spec, registry
from actorlearner.audit import DeviceLaunches, HostReads, HostTraffic, state_addresses
from actorlearner.learner.step import LearnerStep
from actorlearner.networks import UnsupportedSpace
from actorlearner.replay import PrioritizedReplay, make_replay

INTERPRETED = pytest.mark.skipif(not INTERPRETING_TRITON, reason="triton compiles its kernels in this process: "
                                 "tests/replay/test_triton_tree.py reruns this module in one that interprets them")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))]
CARTPOLE = (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2))
HALFCHEETAH = (gym.spaces.Box(-1, 1, (17,), np.float32), gym.spaces.Box(-1, 1, (6,), np.float32))
ALGORITHMS = {"dqn": CARTPOLE, "r2d2": CARTPOLE, "sac": HALFCHEETAH, "td3": HALFCHEETAH}
MINATAR = (gym.spaces.Box(0, 1, (10, 10, 4), bool), gym.spaces.Discrete(6))
BRANCHES = (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.MultiDiscrete([3, 4], start=[0, -1]))
SPACES = {"vector": CARTPOLE, "image": MINATAR, "branches": BRANCHES, "box": HALFCHEETAH}


def capturable_cases() -> list:
    """Every registered algorithm whose trainer opts into capture, on each kind of space it learns from."""
    cases = []
    for name in registry.REGISTERED:
        if registry.resolve(name).trainer_class.capturable:
            for kind, spaces in SPACES.items():
                try:
                    make_spec(name, *spaces)
                except UnsupportedSpace:
                    continue
                cases.append(pytest.param(name, spaces, id=f"{name}-{kind}"))
    return cases


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


def filled_replay(fields, device: str, n: int = 512, versions: int = 4, kernels: str = "torch") -> PrioritizedReplay:
    replay = make_replay(1024, fields, device=device, kernels=kernels)
    rng = np.random.default_rng(0)
    for version in range(versions):
        replay.add(random_items(fields, n // versions, rng), priorities=rng.random(n // versions) + 0.1,
                   policy_version=version)
    return replay


def make_step(name: str, device: str, batch_size: int = 32, spaces=None, kernels: str = "torch",
              **config) -> LearnerStep:
    spec = make_spec(name, *(spaces or ALGORITHMS[name]), config or None)
    trainer = spec.make_trainer(device=device, seed=0)
    return LearnerStep(trainer, filled_replay(spec.transition_fields(), device, kernels=kernels), batch_size)


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
    add_on_device = sums.adder(("q", "loss"), torch.device("cpu"))  # what a captured step records
    captured = state_addresses(sums._captured)
    with HostReads("cpu") as counted:
        add_on_device({"loss": torch.tensor(5.0), "q": torch.tensor(0.0)})
        sums.count += 1
        sums.add({"loss": torch.tensor(7.0), "q": torch.tensor(4.0)})
        sums.fold()  # eager steps' tensors into sums of their own: the captured sums stay where they are
        sums.add({"entropy": torch.tensor(2.0)})
        sums.fold()
    assert not counted.counts
    assert state_addresses(sums._captured) == captured
    with HostReads("cpu") as counted:
        means = sums.read()
    assert sum(counted.counts.values()) == 1
    assert means == {"loss": 16 / 5, "q": 16 / 5, "lr": 1.0 / 5, "entropy": 2.0 / 5}  # five steps
    assert sums.read() == {}
    add_on_device({"loss": torch.tensor(2.0), "q": torch.tensor(6.0)})
    sums.count += 1
    assert sums.read() == {"loss": 2.0, "q": 6.0, "lr": 0.0}


def audit_captured_part(step: LearnerStep, steps: int = 3) -> tuple[dict, dict, dict]:
    """Run the part of ``step`` that a CUDA graph captures ``steps`` times (after eager warm-up steps, each
    preceded by its host half) under the host-read and host-traffic audits; returns their counts and
    the state tensors that moved meanwhile."""
    for _ in range(4):  # lazy optimizer state; TD3 takes both of its phases
        assert step()
    assert step.replay.start_sample(step.batch_size)
    add_metrics = step.metrics.adder(tuple(step._device_step()), step.replay.device)  # as _try_capture does
    watched = (step.trainer, step.replay, step.metrics)
    before = state_addresses(*watched)
    reads, traffic = HostReads(step.replay.device), HostTraffic(*watched)
    for _ in range(steps):
        assert step.replay.start_sample(step.batch_size)
        with reads, traffic:
            add_metrics(step._device_step())
        step.trainer.advance()
    after = state_addresses(*watched)
    moved = {path: (before.get(path), after.get(path)) for path in before.keys() | after.keys()
             if before.get(path) != after.get(path)}
    return dict(reads.counts), dict(traffic.calls), moved


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=INTERPRETED)])
@pytest.mark.parametrize("name, spaces", capturable_cases())
def test_the_captured_part_of_every_capturable_step_makes_nothing_from_host_data(name, spaces, kernels):
    """What capture refuses or silently bakes in: no tensor made from host values, no host tensor moved to
    the device or taken as an operand, no host read, and the state a graph reads (networks, optimizer,
    replay, metric sums) stays at its addresses. With the replay's torch operations and its Triton kernels
    (interpreted)."""
    step = make_step(name, "cpu", spaces=spaces, kernels=kernels)
    reads, traffic, moved = audit_captured_part(step)
    assert not reads, f"{name}: host reads in the captured part: {reads}"
    assert not traffic, f"{name}: host traffic in the captured part: {traffic}"
    assert not moved, f"{name}: state rebound to new tensors: {sorted(moved)[:5]}"


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=INTERPRETED)])
def test_inserts_and_evictions_never_wait_for_the_device(kernels):
    """An insert's rows, versions and priorities reach the device through pinned staging with asynchronous
    copies, and the commit sets keys, leaves and the running maximum priority on the device; an eviction
    uploads its slots the same way. Nothing blocks and nothing reads a device value, and what went in is
    what the replay holds."""
    fields = {"obs": ((4,), torch.float32), "action": ((), torch.int64)}
    replay = make_replay(100, fields, alpha=1.0, kernels=kernels)
    rng = np.random.default_rng(3)
    highest = 1.0  # the replay's initial maximum priority
    with HostTraffic(replay) as traffic:
        for i in range(8):  # 240 items through a ring of 100: wrapping inserts
            given = rng.random(30) * 4 if i % 2 else None
            highest = max(highest, given.max()) if given is not None else highest
            versions = np.full(30, i) if i % 3 else i  # one per item, or one for all
            keys = replay.add(random_items(fields, 30, rng), priorities=given, policy_version=versions)
            sample = replay.sample(16, min_policy_version=max(0, i - 2))  # evictions as the version rises
            new = torch.rand(16, dtype=torch.float64, device=replay.device) * 2
            replay.update_priorities(sample.indices, new)
    assert traffic.blocking() == 0, traffic.calls
    assert traffic.counts["h2d_async"] >= 8 + 6, traffic.calls  # every insert's rows, every eviction's slots
    replay.check_errors()
    leaves = replay._tree.leaves
    assert float(replay._max_priority_t) >= highest
    assert torch.equal(replay._versions[replay._keys >= 0] >= 5, leaves[replay._keys >= 0] > 0)  # evicted below 5
    assert torch.equal(replay._keys[keys.remainder(100)], keys)  # the last insert's keys, committed


@INTERPRETED
@pytest.mark.parametrize("batch", [256, 4096])
def test_a_sample_and_update_with_the_triton_kernels_is_seven_launches_below_17_million_items(batch):
    """Counted in the code, as CUDA would launch them: ``torch.rand`` and one kernel for a draw (its IS weights
    and rows gathered inside), two kernels, one per level above the leaves and the top's for an update:
    height + 5. 100,000 items have the height of a million (2); up to 16**3 * 4096 items it stays 2 or
    less. The host half (``start_sample``) fills beta: one more launch, outside a captured graph."""
    fields = {"obs": ((4,), torch.float32), "action": ((), torch.int64)}
    replay = make_replay(100_000, fields, kernels="triton")
    rng = np.random.default_rng(4)
    for _ in range(10):
        replay.add(random_items(fields, 10_000, rng), priorities=rng.random(10_000) + 0.01)
    assert replay._tree.height == 2 and replay.start_sample(batch)
    new = torch.rand(batch, device=replay.device)
    with DeviceLaunches() as launches:
        sample = replay.draw(batch)
        replay.update_priorities(sample.indices, new)
    assert launches.counts == {"aten.uniform_": 1, "triton._draw_kernel": 1, "triton._check_kernel": 1,
                               "triton._priority_kernel": 1, "triton._parent_kernel": 2, "triton._top_kernel": 1}
    replay.check_errors()
    keys = sample.indices.tolist()
    last = {key: at for at, key in enumerate(keys)}  # repeated keys: the last write wins
    want = (new[[last[key] for key in keys]].double() + replay.eps) ** replay.alpha
    torch.testing.assert_close(replay._tree.leaves[sample.indices.remainder(100_000)], want, rtol=1e-12, atol=0)
