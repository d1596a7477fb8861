"""A SAC or TD3 checkpoint loads on any device: a generator state saved on another device type reseeds the
trainer's generator deterministically instead of failing to load. On the same device type it is restored
exactly: test_continuous.py's state round trip and test_checkpoint.py's resumed learner check that."""

from __future__ import annotations

import logging
import struct

import pytest
import torch
from test_continuous import ALGORITHMS, OBS
from test_continuous import ASYMMETRIC as ACTIONS
from test_continuous import batch as sample

from actorlearner.algorithms import make_spec
from actorlearner.checkpoint.generator import device_tag


def make(name: str, seed: int = 0, device: str = "cpu"):
    """A small trainer."""
    return make_spec(name, OBS, ACTIONS, {"hidden_sizes": (16, 16)}).make_trainer(device=device, seed=seed)


def philox(seed: int, offset: int) -> torch.Tensor:
    """A CUDA generator's state as ``torch.cuda`` gives it: Philox seed and offset, 16 bytes."""
    return torch.tensor(list(struct.pack("<QQ", seed, offset)), dtype=torch.uint8)


def trained_state(name: str, generator: torch.Tensor, tagged: bool = True) -> dict:
    """A trainer's state after three updates, its generator entry replaced by ``generator`` (from cuda)."""
    trainer = make(name)
    for _ in range(3):
        trainer.update(sample())
    state = {**trainer.state_dict(), "generator": generator, "generator.device": device_tag("cuda")}
    if not tagged:
        del state["generator.device"]
    return state


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "untagged-by-size"])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_cuda_generator_state_loads_into_a_cpu_trainer_reseeded_from_it(name, tagged, caplog):
    state = trained_state(name, philox(1234, 4096), tagged)
    first, second, other = make(name, seed=5), make(name, seed=6), make(name, seed=5)
    with caplog.at_level(logging.INFO, logger="actorlearner.checkpoint.generator"):
        first.load_state_dict(state)
    assert "generator 'generator' was saved on cuda, loaded on cpu: reseeded with" in caplog.text
    second.load_state_dict(state)
    other.load_state_dict({**state, "generator": philox(1234, 8192)})
    for key, value in first.state_dict().items():
        if isinstance(value, torch.Tensor) and not key.startswith("generator"):
            assert torch.equal(value, state[key]), key  # networks and optimizer slots come back exactly
    assert torch.equal(first.generator.get_state(), second.generator.get_state())  # the same checkpoint, the same seed
    assert not torch.equal(first.generator.get_state(), other.generator.get_state())
    assert not torch.equal(first.generator.get_state(), make(name, seed=5).generator.get_state())
    a, _ = first.update(sample())
    b, _ = second.update(sample())
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # training goes on, deterministically


@pytest.mark.parametrize("name", ALGORITHMS)
def test_an_untagged_cpu_generator_state_is_restored_exactly(name):
    """A checkpoint from before the device tag, written on the CPU: told by its size, restored bit for bit."""
    trainer = make(name)
    trainer.update(sample())
    state = trainer.state_dict()
    del state["generator.device"]
    resumed = make(name, seed=5)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.generator.get_state(), trainer.generator.get_state())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device for the real round trip (cuda trainer -> cpu -> cuda)")
@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_cuda_trainers_state_loads_on_the_cpu_and_back(name):
    gpu = make(name, device="cuda")
    for _ in range(3):
        gpu.update(sample())
    state = gpu.state_dict()
    cpu = make(name, seed=5)
    cpu.load_state_dict(state)  # Philox into mt19937: reseeded
    for key, value in cpu.state_dict().items():
        if isinstance(value, torch.Tensor) and not key.startswith("generator"):
            assert torch.equal(value, state[key]), key
    cpu.update(sample())
    back = make(name, seed=5, device="cuda")
    back.load_state_dict(cpu.state_dict())  # mt19937 into Philox: reseeded
    back.update(sample())
    same = make(name, seed=5, device="cuda")
    same.load_state_dict(state)  # the same device type: exactly
    assert torch.equal(same.generator.get_state(), gpu.generator.get_state())
