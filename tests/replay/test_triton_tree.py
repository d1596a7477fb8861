"""The Triton sum-tree kernels (actorlearner/replay/triton_tree.py) against SumTree's torch code: the same
leaves, bit for bit, from the same uniforms, and the same tree after the same updates: on the CPU through
triton's interpreter, on CUDA compiled."""

import os
import subprocess
import sys

# Triton reads TRITON_INTERPRET when @triton.jit decorates a function, its own functions included (at
# `import triton`): set before triton's first import, this process interprets every kernel, on CPU tensors
# too. It stays set (a later import still decorates). TRITON_INTERPRET=0 keeps the kernels compiled.
if "triton" not in sys.modules and os.environ.get("TRITON_INTERPRET") != "0":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
from triton.runtime.jit import JITFunction  # noqa: E402

from actorlearner.replay import make_replay, triton_tree  # noqa: E402
from actorlearner.replay.sumtree import SumTree  # noqa: E402

# One process runs the kernels interpreted or compiled, never both: what this one can't, a fresh one does.
INTERPRETING = not any(isinstance(fn, JITFunction) for fn in (triton_tree._sample_kernel, triton.language.sum))
interpreted = triton_tree if INTERPRETING else None
in_interpreter = pytest.mark.skipif(not INTERPRETING, reason="triton was imported compiled before this module "
                                    "(torch.onnx.export imports it): test_interpreted_in_a_fresh_process runs this")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
compiled = pytest.mark.skipif(triton_tree.INTERPRETED, reason="this process interprets triton: "
                              "test_compiled_in_a_fresh_process runs this")


def _pytest_in_a_fresh_process(args: list[str], interpret: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": interpret}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          env=env, capture_output=True, text=True, timeout=600, cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


INTERPRETED_ELSEWHERE = ["test_replay_buffer.py", "test_replay_snapshot.py", "test_concurrent_ingest.py",
                         "test_device_step.py"]
"""Modules whose cases with the replay's Triton kernels on the CPU (ids with "triton") need an interpreter."""


def test_interpreted_in_a_fresh_process():
    if INTERPRETING:
        pytest.skip("this process interprets triton: the tests ran here")
    _pytest_in_a_fresh_process(["-m", "not cuda", __file__], "1")
    _pytest_in_a_fresh_process(["-m", "not cuda", "-k", "triton", *INTERPRETED_ELSEWHERE], "1")


@pytest.mark.cuda
@needs_cuda
def test_compiled_in_a_fresh_process():
    if not triton_tree.INTERPRETED:
        pytest.skip("this process compiles triton's kernels: the tests ran here")
    _pytest_in_a_fresh_process(["-m", "cuda", __file__], "0")


# (capacity, branching, max_top, height): heights 0 to 4, K from 2 to 16.
SHAPES = [(1, 2, 1, 0), (37, 3, 64, 0), (300, 16, 4096, 0), (37, 3, 16, 1), (300, 16, 32, 1),
          (37, 3, 5, 2), (200, 4, 16, 2), (1000, 16, 4, 2), (64, 2, 4, 4)]
SHAPE_IDS = [f"cap{c}-k{k}-h{h}" for c, k, _, h in SHAPES]


def _priorities(capacity: int, seed: int) -> torch.Tensor:
    """Magnitudes over eight decades, a third of the leaves zero, and a zero head and tail (zero nodes first,
    zero children last)."""
    g = torch.Generator().manual_seed(seed)
    decades = 8 * torch.rand(capacity, generator=g, dtype=torch.float64) - 4
    values = torch.rand(capacity, generator=g, dtype=torch.float64) * 10.0**decades
    values[torch.rand(capacity, generator=g) < 1 / 3] = 0.0
    values[:capacity // 7] = 0.0
    values[capacity - capacity // 7:] = 0.0
    if not values.any():
        values[0] = 1.0
    return values


def _tree(shape, device="cpu", seed=0, kernels="default") -> SumTree:
    """A random tree; ``kernels``: the module its sample and update call (None: the torch code), or its own."""
    capacity, k, max_top, height = shape
    tree = SumTree(capacity, k, device, max_top=max_top)
    assert tree.height == height
    tree.update_range(0, _priorities(capacity, seed).to(device))
    if kernels != "default":
        tree._triton = kernels
    return tree


def _assert_same_tree(got: SumTree, want: SumTree, rtol: float = 1e-13) -> None:
    """Leaves, minima and the root minimum exactly; inner sums and prefix sums to ``rtol``, the mass left of
    each top node to ``rtol`` of the total (the kernels add a node's K children in their own order; each
    parent is recomputed from its children, so the differences never grow)."""
    assert torch.equal(got._sums[-1], want._sums[-1])
    for a, b in zip(got._mins, want._mins):
        assert torch.equal(a, b)
    assert torch.equal(got._min, want._min)
    for a, b in zip([*got._sums[:-1], got._top_cumsum], [*want._sums[:-1], want._top_cumsum]):
        torch.testing.assert_close(a, b, rtol=rtol, atol=0)
    torch.testing.assert_close(got._top_before, want._top_before, rtol=rtol, atol=rtol * float(want.total()))


@in_interpreter
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_sample_matches_torch_bit_for_bit(shape):
    tree = _tree(shape, seed=1)
    for batch in (1, 7, 256):
        tree._triton = None
        want = tree.sample_positive(batch, torch.Generator().manual_seed(batch))
        tree._triton = interpreted
        got = tree.sample_positive(batch, torch.Generator().manual_seed(batch))
        assert torch.equal(got, want), f"batch {batch}: {(got != want).sum()} indices differ"
        assert bool((tree.leaves[got] > 0).all())


def _same_as_torch(tree: SumTree, uniforms: torch.Tensor, monkeypatch) -> torch.Tensor:
    """The kernel's leaves for ``uniforms`` are torch's (its ``torch.rand`` made to return them), all positive."""
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: uniforms.clone())
    tree._triton = None
    want = tree.sample_positive(uniforms.shape[0])
    assert torch.equal(interpreted.sample_from_uniforms(tree, uniforms), want)
    assert bool((tree.leaves[want] > 0).all())
    return want


@in_interpreter
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_sample_edge_uniforms(shape, monkeypatch):
    """Uniforms at 0 and just below 1 (targets at the tree's ends, past trailing zero children)."""
    tree = _tree(shape, seed=2)
    edges = torch.tensor([0.0, 0.5, 1.0 - 2.0**-30, 1.0 - 2.0**-53], dtype=torch.float64)
    for repeats in (1, 4, 5):  # 4: the last target rounds to the total, and must be clamped below it
        _same_as_torch(tree, edges.repeat(repeats), monkeypatch)


@in_interpreter
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_sample_targets_on_boundaries(shape, monkeypatch):
    """Integer leaves and zero uniforms: targets fall exactly on running sums (right=True picks the next
    leaf) and, for a batch size that is no power of two, on whichever side the division rounds."""
    capacity = shape[0]
    tree = _tree(shape)
    values = torch.randint(0, 4, (capacity,), generator=torch.Generator().manual_seed(3)).double()
    values[0], values[-1] = 0.0, 1.0
    tree.update_range(0, values)
    for batch in (int(values.sum()), 3, 7, 100):
        _same_as_torch(tree, torch.zeros(batch, dtype=torch.float64), monkeypatch)
    if capacity >= 14:  # 3 * (14 / 6) is 7 exactly, 3 * (14 * (1 / 6)) is below it: torch's CPU division
        values = torch.zeros(capacity, dtype=torch.float64)
        values[torch.randperm(capacity, generator=torch.Generator().manual_seed(4))[:14]] = 1.0
        tree.update_range(0, values)
        _same_as_torch(tree, torch.zeros(6, dtype=torch.float64), monkeypatch)


@in_interpreter
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_sample_all_zero_tree_stays_inside(shape, monkeypatch):
    """A zero total is no valid input, yet the indices stay inside the tree, as torch's do."""
    tree = SumTree(*shape[:2], max_top=shape[2])
    uniforms = torch.tensor([0.0, 0.5, 1.0 - 2.0**-53], dtype=torch.float64)
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: uniforms.clone())
    tree._triton = None
    want = tree.sample_positive(3)
    assert torch.equal(interpreted.sample_from_uniforms(tree, uniforms), want)
    assert bool((want < shape[0]).all())


@in_interpreter
def test_sample_clamps_the_target_to_the_childrens_sum(monkeypatch):
    """A parent whose stored sum rounds above its children's running sum (torch's sum of 16 adds in lanes):
    a target at the end of the tree must still land on the last positive child, not on a zero after it."""
    tree = SumTree(32, 16, max_top=2)
    values = torch.zeros(32, dtype=torch.float64)
    values[16], values[17:25] = 1.0, 2.0**-53
    tree.update_range(0, values)
    slots = _same_as_torch(tree, torch.full((4,), 1.0 - 2.0**-53, dtype=torch.float64), monkeypatch)
    assert slots[-1] < 25


@in_interpreter
def test_sample_extreme_magnitudes():
    """The torch tests' rounding edge: 1e-300, 1 and 1e300 among zeros."""
    tree = SumTree(64, 4, max_top=4)
    values = torch.zeros(64, dtype=torch.float64)
    values[[0, 17, 63]] = torch.tensor([1e-300, 1.0, 1e300], dtype=torch.float64)
    tree.update_range(0, values)
    for seed in range(3):
        tree._triton = None
        want = tree.sample_positive(100, torch.Generator().manual_seed(seed))
        tree._triton = interpreted
        assert torch.equal(tree.sample_positive(100, torch.Generator().manual_seed(seed)), want)
    assert set(want.tolist()) <= {0, 17, 63}


@in_interpreter
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_update_matches_torch(shape):
    capacity = shape[0]
    want, got = _tree(shape, seed=3, kernels=None), _tree(shape, seed=3, kernels=interpreted)
    g = torch.Generator().manual_seed(4)
    for _ in range(3):  # repeated indices (last write wins), zeros, and leaves going to zero and back
        n = capacity // 2 + 3
        indices = torch.randint(0, capacity, (n,), generator=g)
        values = torch.rand(n, generator=g, dtype=torch.float64)
        values[torch.rand(n, generator=g) < 0.25] = 0.0
        want.update(indices, values)
        got.update(indices, values)
        _assert_same_tree(got, want)


@in_interpreter
def test_update_last_write_wins_in_both_kernel_paths(monkeypatch):
    """Small updates drop earlier writes inside the leaf kernel; large ones go through the torch sort first."""
    for dedup_max in (interpreted.DEDUP_MAX, 4):
        monkeypatch.setattr(interpreted, "DEDUP_MAX", dedup_max)
        tree = SumTree(10, 2, max_top=2)
        tree._triton = interpreted
        tree.update(torch.tensor([3, 5, 3, 3, 5]), torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5], dtype=torch.float64))
        assert tree.leaves[3].item() == 4.0 and tree.leaves[5].item() == 0.5 and float(tree.total()) == 4.5
        tree.update(torch.tensor([5, 3, 5]), torch.tensor([7.0, 0.0, 1.0], dtype=torch.float64))
        assert tree.leaves[3].item() == 0.0 and tree.leaves[5].item() == 1.0 and float(tree.total()) == 1.0
        assert float(tree.min_positive()) == 1.0


def test_dispatch():
    """The torch code on the CPU, and on CUDA where triton is interpreted; the compiled kernels on CUDA."""
    assert SumTree(10)._triton is None
    if torch.cuda.is_available():
        assert SumTree(10, device="cuda")._triton is (None if triton_tree.INTERPRETED else triton_tree)


@pytest.mark.cuda
@compiled
@needs_cuda
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_cuda_kernels_match_torch(shape):
    """Compiled on CUDA. Samples: torch's CUDA cumsum adds a node's children in another order than the
    kernel, so a target within rounding of a boundary could part them; random uniforms never come close."""
    tree = _tree(shape, "cuda", seed=5)
    assert tree._triton is triton_tree
    for batch in (1, 7, 256, 1000):
        tree._triton = None
        want = tree.sample_positive(batch, torch.Generator("cuda").manual_seed(batch))
        tree._triton = triton_tree
        assert torch.equal(tree.sample_positive(batch, torch.Generator("cuda").manual_seed(batch)), want)
    capacity = shape[0]
    want, got = _tree(shape, "cuda", seed=6, kernels=None), _tree(shape, "cuda", seed=6)
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        n = capacity // 2 + 3
        indices, values = torch.randint(0, capacity, (n,), generator=g), torch.rand(n, generator=g, dtype=torch.float64)
        want.update(indices.cuda(), values.cuda())
        got.update(indices.cuda(), values.cuda())
        _assert_same_tree(got, want, rtol=1e-12)


@pytest.mark.cuda
@compiled
@needs_cuda
def test_cuda_sample_and_update_launches_and_graph_capture():
    """Height + 4 kernels for a sample and an update (rand, sample, leaves, one per level, top); captured in
    a CUDA graph, a replay writes the same values again."""
    tree = _tree((5000, 16, 64, 2), "cuda", seed=8)
    indices = torch.randint(0, 5000, (256,), device="cuda")
    values = torch.rand(256, dtype=torch.float64, device="cuda")
    generator = torch.Generator("cuda").manual_seed(9)

    def step():
        slots = tree.sample_positive(256, generator)
        tree.update(indices, values)
        return slots

    step()  # compiles the kernels
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        slots = step()
    graph.replay()
    reference = _tree((5000, 16, 64, 2), "cuda", seed=8, kernels=None)
    reference.update(indices, values)
    _assert_same_tree(tree, reference)
    assert bool((tree.leaves[slots] > 0).all())
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        pytest.skip("the profiler recorded no CUDA kernel (no CUPTI?)")
    assert len(kernels) == tree.height + 4, kernels


# The replay's fused kernels (actorlearner/replay/triton_replay.py) against its torch operations: rows wider
# than one step of the draw's gather loop, trees of heights 0 to 2.
REPLAY_FIELDS = {"obs": ((3,), torch.float32), "frame": ((18, 16), torch.uint8), "flag": ((), torch.bool),
                 "action": ((), torch.int64)}
REPLAY_SHAPES = [(50, 16), (5000, 16), (9000, 2)]


def _replays(capacity: int, branching: int, device: str = "cpu", items: int = 0) -> tuple:
    """The same items in a replay of torch operations and one of Triton kernels (wrapping the ring)."""
    g = torch.Generator().manual_seed(capacity)
    replays = [make_replay(capacity, REPLAY_FIELDS, device=device, kernels=kernels, branching=branching)
               for kernels in ("torch", "triton")]
    for _ in range(3):
        n = (items or capacity) // 2 + 7
        batch = {"obs": torch.rand(n, 3, generator=g), "frame": torch.randint(0, 256, (n, 18, 16), generator=g).byte(),
                 "flag": torch.rand(n, generator=g) < 0.5, "action": torch.randint(0, 9, (n,), generator=g)}
        priorities, versions = torch.rand(n, generator=g, dtype=torch.float64) * 3, torch.randint(0, 4, (n,))
        for replay in replays:
            replay.add(batch, priorities=priorities, policy_version=versions)
    return replays


def _same_samples(a, b) -> None:
    assert torch.equal(a.indices, b.indices) and torch.equal(a.policy_version, b.policy_version)
    assert all(torch.equal(a.data[name], b.data[name]) for name in a.data)
    torch.testing.assert_close(a.weights, b.weights, rtol=1e-6, atol=0)  # pow: libdevice's or exp(log)


@in_interpreter
@pytest.mark.parametrize("capacity, branching", REPLAY_SHAPES)
def test_replay_draws_and_updates_match_the_torch_path(capacity, branching):
    """The same draws (slots bit for bit, rows, weights), the same refusals, the same leaves after updates
    with repeated keys (last write wins), stale keys (overwritten items: ignored), and an eviction."""
    by_torch, by_triton = _replays(capacity, branching)
    assert by_triton._kernels is not None and by_torch._kernels is None
    g = torch.Generator().manual_seed(1)
    for step, batch in enumerate((1, 7, min(256, capacity), 32)):
        min_version = 2 if step == 3 else None
        with torch.random.fork_rng(devices=[]):
            want = by_torch.sample(batch, min_policy_version=min_version)
        got = by_triton.sample(batch, min_policy_version=min_version)
        _same_samples(got, want)
        stale = torch.randint(0, max(1, by_torch.inserted - capacity), (3,), generator=g)
        keys = torch.cat([want.indices, want.indices[:2], stale])
        new = torch.rand(keys.shape[0], generator=g) * 5
        if step == 2:  # one NaN: the whole call is refused, and said so at the next read
            new[5] = float("nan")
        for replay in (by_torch, by_triton):
            replay.update_priorities(keys, new)
        torch.testing.assert_close(by_triton._tree.leaves, by_torch._tree.leaves, rtol=1e-13, atol=0)
        assert float(by_triton._max_priority_t) == float(by_torch._max_priority_t)
        for replay in (by_torch, by_triton):
            if step == 2:
                with pytest.raises(ValueError, match="NaN"):
                    replay.check_errors()
            replay.check_errors()


@pytest.mark.cuda
@compiled
@needs_cuda
@pytest.mark.parametrize("capacity, branching", REPLAY_SHAPES)
def test_cuda_replay_kernels_match_torch_and_are_captured_in_seven_launches(capacity, branching):
    """Compiled on CUDA: the same draws and leaves as the replay's torch operations there (libdevice's pow
    is torch's), and a draw + update captured in a CUDA graph: height + 5 kernels a replay."""
    by_torch, by_triton = _replays(capacity, branching, "cuda")
    for batch in (7, 256):
        with torch.random.fork_rng(devices=["cuda"]):
            want = by_torch.sample(batch)
        got = by_triton.sample(batch)
        _same_samples(got, want)
        new = torch.rand(batch, device="cuda") * 5
        for replay in (by_torch, by_triton):
            replay.update_priorities(got.indices, new)
        torch.testing.assert_close(by_triton._tree.leaves, by_torch._tree.leaves, rtol=1e-12, atol=0)
    new = torch.rand(256, device="cuda")
    assert by_triton.start_sample(256)
    by_triton.update_priorities(by_triton.draw(256).indices, new)  # kernels compiled, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sample = by_triton.draw(256)
        by_triton.update_priorities(sample.indices, new)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        pytest.skip("the profiler recorded no CUDA kernel (no CUPTI?)")
    assert len(kernels) == by_triton._tree.height + 5, kernels
    by_triton.check_errors()
