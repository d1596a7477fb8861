"""Shared fixtures: every device-aware test runs on CPU and, when there is one, on CUDA; and the order
in which `make test` hands modules to its pytest-xdist workers.

Tests sit in one folder per room of the package they test (``tests/learner/``, ``tests/replay/``...);
what they share (process helpers, test envs, raw clients) is in ``tests/support/``, importable by name.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

import actorlearner  # noqa: F401  before any test module imports grpc: it sets gRPC's environment (fork handlers off)

sys.path.insert(0, str(Path(__file__).parent / "support"))

# Without a GPU, triton's kernels run in its interpreter, on CPU tensors: the replay's Triton path is tested
# through the same functions. Triton reads this at its first import; TRITON_INTERPRET=0 keeps them compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETING_TRITON = os.environ.get("TRITON_INTERPRET") == "1"

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
_INTERPRETED = pytest.mark.skipif(not INTERPRETING_TRITON, reason="triton compiles its kernels in this process: "
                                  "tests/replay/test_triton_tree.py reruns these in one that interprets them")
_COMPILED = pytest.mark.skipif(INTERPRETING_TRITON, reason="triton interprets its kernels in this process")
# The replay's kernel paths: the compiled CPU kernels, and the device path's torch operations and Triton
# kernels, on the CPU (Triton interpreted) and on CUDA (compiled).
REPLAY_PATHS = [
    pytest.param({"device": "cpu", "kernels": "auto"}, id="compiled"),
    pytest.param({"device": "cpu", "kernels": "torch"}, id="torch-cpu"),
    pytest.param({"device": "cpu", "kernels": "triton"}, id="triton-cpu", marks=_INTERPRETED),
    pytest.param({"device": "cuda", "kernels": "torch"}, id="torch-cuda", marks=_CUDA),
    pytest.param({"device": "cuda", "kernels": "triton"}, id="triton-cuda", marks=[*_CUDA, _COMPILED]),
]


@pytest.fixture(params=REPLAY_PATHS)
def replay_path(request) -> dict:
    """Keyword arguments of :func:`~actorlearner.replay.make_replay` naming one kernel path."""
    return request.param


@pytest.fixture
def one_torch_thread():
    """Torch at one thread, as actors run by default (``torch_threads`` 1): tiny nets on shared cores are
    slower with more. A module opts in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=[path for path in REPLAY_PATHS if path.id != "triton-cpu"])
def fast_replay_path(request) -> dict:
    """:func:`replay_path` but for triton's interpreter (a hundred times slower per call): for tests of many
    calls whose subject is not the Triton kernels (tests/replay/test_triton_tree.py holds those to the torch code)."""
    return request.param


@pytest.fixture
def make_tree(fast_replay_path):
    """Builds the sum tree of one kernel path: ``make_tree(capacity, branching=16, max_top=4096)``."""
    from actorlearner.replay.sumtree import CpuSumTree, SumTree

    def make(capacity: int, branching: int = 16, max_top: int = 4096):
        if fast_replay_path["kernels"] == "auto":
            return CpuSumTree(capacity, branching)  # no flat top level: max_top is the torch tree's
        return SumTree(capacity, branching, fast_replay_path["device"], max_top=max_top,
                       triton=fast_replay_path["kernels"] == "triton")
    return make


def pytest_collection_modifyitems(config, items):
    """`make test` gives each module whole to one of its pytest-xdist workers (``--dist loadfile``). The
    learning tests race the clock, so they share one module, run in turn; it goes first, being longest."""
    items.sort(key=lambda item: item.get_closest_marker("learning") is None)
