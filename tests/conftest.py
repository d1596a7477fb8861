"""Shared fixtures: every device-aware test runs on CPU and, when there is one, on CUDA."""

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
