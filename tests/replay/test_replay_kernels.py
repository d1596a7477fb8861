"""The compiled replay kernels: used by default on CPU, compiled on first use with no toolchain, cached after."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from actorlearner.replay import make_replay
from replay_reference import importance_weights, stratified_draws

FIELDS = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}

_FIRST_USE = textwrap.dedent("""
    import json, numpy as np, torch
    from actorlearner.replay import kernels, make_replay
    buf = make_replay(1000, {"obs": ((3,), torch.float32), "action": ((), torch.int64)})
    buf.add({"obs": np.ones((300, 3), np.float32), "action": np.arange(300)})
    sample = buf.sample(32)
    buf.update_priorities(sample.indices, np.ones(32))
    used = [kernels.write_rows, kernels.insert_items, kernels.sample_rows, kernels.update_priorities]
    print(json.dumps({"compiled": buf.compiled, "hits": sum(sum(k.stats.cache_hits.values()) for k in used),
                      "misses": sum(sum(k.stats.cache_misses.values()) for k in used)}))
""")


def test_kernels_compile_on_first_use_without_a_toolchain_and_load_from_the_cache_after(tmp_path):
    # No compiler on PATH: numba compiles through the LLVM its wheel carries.
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PATH": str(tmp_path / "no-toolchain")}
    runs = [json.loads(subprocess.run([sys.executable, "-c", _FIRST_USE], env=env, capture_output=True,
                                      text=True, check=True, timeout=300).stdout) for _ in range(2)]
    assert runs[0]["compiled"] and runs[0]["misses"] > 0 and runs[0]["hits"] == 0
    assert runs[1]["misses"] == 0 and runs[1]["hits"] > 0, "the second process compiled again"
    assert any((tmp_path / "cache").rglob("*.nbi")), "no cache index written"


def test_cpu_buffers_run_the_compiled_kernels_unless_told_otherwise():
    assert make_replay(8, FIELDS).compiled
    assert not make_replay(8, FIELDS, kernels="torch").compiled


IMAGE_FIELDS = {"obs": ((16, 16, 3), torch.uint8), "action": ((), torch.int64)}  # wide rows: block copies


@pytest.mark.parametrize("fields", [FIELDS, IMAGE_FIELDS], ids=["vector", "image"])
def test_compiled_and_torch_paths_agree_item_for_item(fields):
    """Same writes, same seed: the same draws, weights, rows and leaves on both paths, and the reference's."""
    rng = np.random.default_rng(3)
    buffers = [make_replay(500, fields, kernels=kind) for kind in ("auto", "torch")]
    shape, dtype = fields["obs"]
    batches = [{"obs": torch.randint(0, 255, (70, *shape)).to(dtype).numpy(), "action": rng.integers(0, 9, 70)}
               for _ in range(9)]
    for i, batch in enumerate(batches):  # 630 items into 500 slots: wraps
        priorities = rng.random(70) if i % 2 else None
        for buf in buffers:
            buf.add(batch, priorities=priorities, policy_version=i)
        beta = buffers[0].beta
        torch.manual_seed(i)
        first = buffers[0].sample(64)
        torch.manual_seed(i)
        second = buffers[1].sample(64)
        assert torch.equal(first.indices, second.indices)
        torch.testing.assert_close(first.weights, second.weights, rtol=1e-6, atol=0)
        for name in fields:
            assert torch.equal(first.data[name], second.data[name])
        leaves = buffers[0]._tree.leaves.numpy()
        torch.manual_seed(i)
        slots = stratified_draws(leaves, torch.rand(64, dtype=torch.float64).numpy())
        np.testing.assert_array_equal(first.indices.numpy() % 500, slots)
        np.testing.assert_allclose(first.weights.numpy(), importance_weights(leaves, slots, beta), rtol=1e-6)
        priorities = rng.random(64) * 5
        for buf, sample in zip(buffers, (first, second)):
            buf.update_priorities(sample.indices, priorities)
        torch.testing.assert_close(buffers[0]._tree.leaves, buffers[1]._tree.leaves, rtol=1e-12, atol=0)
