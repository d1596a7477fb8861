"""Shared fixtures: every device-aware test runs on CPU and, when there is one, on CUDA; and the order
in which `make test` hands modules to its two pytest-xdist workers."""

import pytest
import torch

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
# The replay's kernel paths: the compiled CPU kernels, and the torch device path on CPU and CUDA.
REPLAY_PATHS = [
    pytest.param({"device": "cpu", "kernels": "auto"}, id="compiled"),
    pytest.param({"device": "cpu", "kernels": "torch"}, id="torch-cpu"),
    pytest.param({"device": "cuda", "kernels": "torch"}, id="torch-cuda", marks=_CUDA),
]


@pytest.fixture(params=REPLAY_PATHS)
def replay_path(request) -> dict:
    """Keyword arguments of :class:`PrioritizedReplay` naming one kernel path."""
    return request.param


@pytest.fixture
def one_torch_thread():
    """Torch at one thread, as actors run by default (``torch_threads`` 1): tiny nets on shared cores are
    slower with more. A module opts in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_tree(replay_path):
    """Builds the sum tree of one kernel path: ``make_tree(capacity, branching=16, max_top=4096)``."""
    from actorlearner.replay.sumtree import CpuSumTree, SumTree

    def make(capacity: int, branching: int = 16, max_top: int = 4096):
        if replay_path["kernels"] == "auto":
            return CpuSumTree(capacity, branching)  # no flat top level: max_top is the torch tree's
        return SumTree(capacity, branching, replay_path["device"], max_top=max_top)
    return make


def pytest_collection_modifyitems(config, items):
    """`make test` gives each module whole to one of two pytest-xdist workers (``--dist loadfile``). The
    learning tests race the clock, so they share one module, run in turn; it goes first, being longest."""
    items.sort(key=lambda item: item.get_closest_marker("learning") is None)
