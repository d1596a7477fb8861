"""The algorithm registry: names and package.module:Name resolve to Algorithm classes, configs from mappings."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorlearner import config as cfg
from actorlearner.algorithms import (
    AlgorithmError,
    AlgorithmSpec,
    Policy,
    Trainer,
    config_json,
    make_config,
    make_spec,
    resolve,
)
from actorlearner.algorithms.dqn import DQN, DQNConfig
from actorlearner.algorithms.nstep import NStepAssembler

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


@dataclass
class ConstantConfig:
    """A user's own algorithm config."""

    action: int = 0
    """The action always taken."""
    scale: float = 1.0
    """Multiplies the priorities."""

    def __post_init__(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")


class ConstantAlgorithm(AlgorithmSpec):
    """A user algorithm outside actorlearner: always the same action, nothing learned."""

    name: ClassVar[str] = "constant"
    config_class: ClassVar[type] = ConstantConfig

    def transition_fields(self):
        return {"obs": (self.observation_space.shape, torch.float32), "action": ((), torch.int64),
                "reward": ((), torch.float32), "discount": ((), torch.float32),
                "next_obs": (self.observation_space.shape, torch.float32)}

    def make_assembler(self, num_envs, policy):
        return NStepAssembler(num_envs, 1, 1.0, self.observation_space, (), np.int64)

    def make_policy(self, *, device="cpu", seed=0):
        return ConstantPolicy(self, device=device, seed=seed)

    def make_trainer(self, *, device="cpu", seed=0):
        return ConstantTrainer(self, device=device)


class ConstantPolicy(Policy):
    """Acts with the configured action; priorities are the configured scale."""

    def __init__(self, spec, *, device="cpu", seed=0):
        super().__init__(spec, device=device)
        self.seed = seed

    def exploration(self, actor_index, num_actors):
        return 0.0

    def act(self, obs, exploration):
        return np.full(len(obs), self.config.action, np.int64)

    def initial_priorities(self, fields):
        return torch.full((len(fields["reward"]),), self.config.scale)

    def policy_state_dict(self):
        return {}

    def load_policy_state_dict(self, state):
        pass


class ConstantTrainer(Trainer):
    """Learns nothing."""

    def update(self, sample):
        return torch.full((len(sample.weights),), self.config.scale), {}

    def policy_tensors(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class NoTrainer(AlgorithmSpec):
    """Looks like an algorithm but cannot learn."""

    name = "half"
    config_class = ConstantConfig

    def transition_fields(self): ...
    def make_assembler(self, num_envs, policy): ...
    def make_policy(self, *, device="cpu", seed=0): ...


class PlainConfigClass(ConstantAlgorithm):
    """Every member, but a config_class that is not a dataclass."""

    config_class = dict


NOT_A_CLASS = 42


# ---------------------------------------------------------------- resolve


def test_registered_names_resolve_case_insensitively():
    assert resolve("dqn") is DQN
    assert resolve("DQN") is DQN
    assert resolve("Dqn") is DQN
    assert resolve("actorlearner.algorithms.dqn:DQN") is DQN


def test_a_users_class_resolves_as_module_colon_name():
    cls = resolve(f"{__name__}:ConstantAlgorithm")
    assert cls is ConstantAlgorithm
    algo = make_spec(f"{__name__}:ConstantAlgorithm", OBS_SPACE, ACT_SPACE, {"action": 1, "scale": 2.0})
    assert isinstance(algo, ConstantAlgorithm) and isinstance(algo, AlgorithmSpec)
    assert algo.config == ConstantConfig(action=1, scale=2.0)
    policy = algo.make_policy(device="cpu", seed=5)
    assert (policy.device, policy.seed) == (torch.device("cpu"), 5)
    np.testing.assert_array_equal(policy.act(np.zeros((3, 3), np.float32), 0.0), [1, 1, 1])
    assert isinstance(make_spec(f"{__name__}:ConstantAlgorithm", OBS_SPACE, ACT_SPACE).config, ConstantConfig)


@pytest.mark.parametrize("name", ["ppo", "", "DQN2", "ConstantAlgorithm"])
def test_unknown_names_say_what_to_use(name):
    with pytest.raises(AlgorithmError, match="dqn") as info:
        resolve(name)
    assert "package.module:Name" in str(info.value) and repr(name) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name, says", [
    ("no_such_module_for_actorlearner:Algo", "cannot import no_such_module_for_actorlearner"),
    (f"{__name__}:Missing", f"{__name__} has no Missing"),
    (":DQN", "unknown algorithm"),
    ("actorlearner.algorithms.dqn:", "unknown algorithm"),
])
def test_names_that_resolve_to_nothing(name, says):
    with pytest.raises(AlgorithmError, match=says):
        resolve(name)


def test_a_class_missing_protocol_members_is_refused_naming_them():
    with pytest.raises(AlgorithmError, match="NoTrainer is not an AlgorithmSpec: it lacks make_trainer$"):
        resolve(f"{__name__}:NoTrainer")
    with pytest.raises(AlgorithmError, match="lacks name, config_class, transition_fields"):
        resolve(f"{__name__}:NOT_A_CLASS")
    with pytest.raises(AlgorithmError, match="has no config_class dataclass"):
        resolve(f"{__name__}:PlainConfigClass")


def test_dqn_satisfies_the_runtime_protocol():
    algo = make_spec("dqn", OBS_SPACE, ACT_SPACE)
    assert isinstance(algo, AlgorithmSpec)
    assert DQN.name == "dqn" and DQN.config_class is DQNConfig
    assert not isinstance(object(), AlgorithmSpec)


# ---------------------------------------------------------------- configs


def test_make_config_from_none_an_instance_or_a_mapping():
    assert make_config(DQN) == DQNConfig()
    config = DQNConfig(lr=0.1)
    assert make_config(DQN, config) is config
    assert make_config(DQN, {"lr": 0.1, "hidden_sizes": [4, 4]}) == DQNConfig(lr=0.1, hidden_sizes=(4, 4))
    assert make_config(ConstantAlgorithm, {"action": 3}) == ConstantConfig(action=3)


def test_make_config_refuses_unknown_keys_naming_them():
    with pytest.raises(AlgorithmError, match="dqn has no option bogus, learning_rate$"):
        make_config(DQN, {"lr": 0.1, "learning_rate": 0.1, "bogus": 1})
    with pytest.raises(AlgorithmError, match="constant has no option lr"):
        make_config(ConstantAlgorithm, {"lr": 0.1})


def test_make_config_reports_invalid_values_and_types():
    with pytest.raises(AlgorithmError, match="dqn config: n_step must be >= 1"):
        make_config(DQN, {"n_step": 0})
    with pytest.raises(AlgorithmError, match="constant config: scale must be > 0"):
        make_config(ConstantAlgorithm, {"scale": -1.0})
    with pytest.raises(AlgorithmError, match="dqn wants a DQNConfig or a mapping, got list"):
        make_config(DQN, [("lr", 0.1)])
    with pytest.raises(AlgorithmError, match="wants a DQNConfig"):
        make_config(DQN, ConstantConfig())  # another algorithm's config


@pytest.mark.parametrize("cls, config", [
    (DQN, DQNConfig()),
    (DQN, DQNConfig(hidden_sizes=(7, 5), dueling=False, channel_order="chw", lr=1e-4, n_step=5, tau=0.5,
                    epsilon_base=0.3, epsilon_alpha=3.0)),
    (ConstantAlgorithm, ConstantConfig(action=2, scale=0.5)),
], ids=["dqn defaults", "dqn custom", "user"])
def test_config_json_round_trips(cls, config):
    text = config_json(config)
    values = json.loads(text)
    assert isinstance(values, dict) and set(values) == {f.name for f in dataclasses.fields(config)}
    assert text == json.dumps(values, sort_keys=True)  # canonical: same config, same bytes
    assert make_config(cls, values) == config
    assert config_json(make_config(cls, values)) == text


def test_a_resolved_user_algorithm_gets_prefixed_options_and_its_config():
    name = f"{__name__}:ConstantAlgorithm"
    argv = ["--algorithm", name, "--constant-action", "2"]
    algorithm = resolve(cfg.algorithm_name(argv, {}))
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cfg.LearnerConfig, algorithm)
    learner = cfg.build(cfg.LearnerConfig, parser.parse_args(argv), {"ACTORLEARNER_CONSTANT_SCALE": "0.5"}, algorithm)
    assert learner.algorithm == name
    assert learner.algorithm_config == ConstantConfig(action=2, scale=0.5)
    algo = make_spec(learner.algorithm, OBS_SPACE, ACT_SPACE, learner.algorithm_config)
    assert algo.config is learner.algorithm_config
