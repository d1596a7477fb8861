"""An actor builds only what acting needs: the policy a Welcome makes holds no optimizer and no target network,
and no more parameters than the network the learner publishes."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from actorlearner.actor.actor import Actor
from actorlearner.algorithms import make_spec
from actorlearner.config import ActorConfig
from actorlearner.learner.spec import field_specs
from actorlearner.v1 import learner_pb2 as pb

CASES = {  # algorithm -> (env, its config, the trainer's network that actors act with)
    "dqn": ("CartPole-v1", {"hidden_sizes": (16,)}, "online"),
    "r2d2": ("CartPole-v1", {"hidden_sizes": (16,), "core_size": 8}, "online"),
    "sac": ("Pendulum-v1", {"hidden_sizes": (16,)}, "actor"),
    "td3": ("Pendulum-v1", {"hidden_sizes": (16,)}, "actor"),
}


def reachable(root: object) -> list[object]:
    """Every object held by ``root``'s attributes, through modules, lists, tuples and dicts."""
    seen, stack, found = set(), [root], []
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        found.append(value)
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif value is root or isinstance(value, nn.Module) or type(value).__module__.startswith("actorlearner"):
            stack.extend(vars(value).values())
    return found


@pytest.mark.parametrize("algorithm", CASES)
def test_the_policy_an_actor_builds_for_a_welcome_holds_no_learner_state(algorithm):
    env, config, acting = CASES[algorithm]
    actor = Actor(ActorConfig(env=env, num_envs=1, learner="127.0.0.1:1"))
    try:
        spec = make_spec(algorithm, actor.obs_space, actor.act_space, config)
        welcome = pb.Welcome(learner_id="learner", settings=pb.Settings(
            batch_size=16, max_unacked=4, codec=pb.CODEC_MSGPACK, num_actors=1, max_message_bytes=64 << 20,
            algorithm=algorithm, algorithm_config=json.dumps(config)), batch_fields=field_specs(spec.transition_fields()))
        policy = actor._build_policy(welcome)  # what the actor calls for each Welcome
    finally:
        actor.envs.close()
    held = reachable(policy)
    assert not [v for v in held if isinstance(v, torch.optim.Optimizer)]
    assert not [name for name in vars(policy) if "target" in name]
    parameters = {id(p): p for v in held if isinstance(v, nn.Module) for p in v.parameters()}
    network = getattr(spec.make_trainer(), acting)
    assert sum(p.numel() for p in parameters.values()) == sum(p.numel() for p in network.parameters()) > 0
