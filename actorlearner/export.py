"""A trained policy as one ONNX file plus a JSON sidecar: what ``actorlearner export`` writes.

ONNX because onnxruntime runs it from C++, C#, Java, Node and Python without torch or
actorlearner, which is what an actor in another language needs (TorchScript is deprecated).
The policy builds the module (its ``export_policy``, see `Policy`); the graph
takes raw env values (all preprocessing is inside the network) with a dynamic batch
dimension. The sidecar ``FILE.json`` names the inputs and outputs and holds both spaces as
env.proto ``Space`` messages in protobuf JSON, so every language reads one schema.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from google.protobuf.json_format import MessageToDict
from gymnasium.vector.utils import batch_space

from actorlearner.networks import field_name, leaf_arrays, leaf_spaces
from actorlearner.specs import space_to_proto
from actorlearner.trained import TrainedPolicy

VERIFY_ENVS, VERIFY_STEPS = 32, 4
"""The written file is checked over this many envs and steps against the policy's own ``act``."""
TOLERANCE = 1e-5
"""Largest relative and absolute difference allowed between float actions; integer actions must be equal."""
BATCH = "batch"
"""The name of the dynamic batch dimension."""
STATE_IN, STATE_OUT = "state/{}", "next_state/{}"
"""Names of a recurrent state's input and output."""
USAGE = ("onnxruntime.InferenceSession(FILE).run(None, {input name: array [batch, *shape] of its dtype}) returns "
         "the outputs in order: the env actions, then any next_state/NAME to feed back as state/NAME next step")


class ExportError(ValueError):
    """A policy that cannot be exported, or a written file that does not act as its policy."""


def sidecar_path(out: str | os.PathLike[str]) -> Path:
    """Where the sidecar of the ONNX file ``out`` goes: ``out`` with ``.json`` appended."""
    return Path(f"{os.fspath(out)}.json")


def export_onnx(trained: TrainedPolicy, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``trained``'s greedy policy to ``out`` (ONNX) and its sidecar; returns the sidecar.

    When onnxruntime is importable the written file is run on sampled observations and
    compared with ``act(obs, 0.0)`` of a copy of the policy (its memory and random state stay
    as they were); the sidecar's ``verified`` says how, or is null. ExportError for a policy that
    cannot export (no ``export_policy``), or for a file that acts otherwise (it is removed).
    """
    policy = trained.policy
    if not policy.can_export:
        raise ExportError(f"algorithm {trained.algorithm} has no export_policy; see docs/write-your-own-algorithm.md")
    observation_space, action_space = trained.observation_space, trained.action_space
    module = policy.export_policy()
    state_sizes = _state_sizes(module)
    inputs, outputs = _signature(observation_space, action_space, state_sizes)
    program = onnx_program(module, observation_space, action_space)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    program.save(out, external_data=False)
    try:
        verified = _verify(out, trained, observation_space, action_space, state_sizes)
    except ExportError:
        out.unlink()
        raise

    sidecar = {
        "format": "onnx", "opset": program.model.opset_imports[""], "file": out.name,
        "env": trained.env, "algorithm": trained.algorithm, "checkpoint": str(trained.source),
        "updates": trained.updates,
        "inputs": inputs, "outputs": outputs,
        "observation_space": MessageToDict(space_to_proto(observation_space)),
        "action_space": MessageToDict(space_to_proto(action_space)),
        "recurrent_state": {"sizes": state_sizes, "initial": "zeros at each episode start"} if state_sizes else None,
        "usage": USAGE, "verified": verified,
    }
    sidecar_path(out).write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def onnx_program(module: torch.nn.Module, observation_space: gym.Space, action_space: gym.Space):
    """The ONNX program of an ``export_policy`` module, batch dimension dynamic (exporter output silenced).

    Its initializers are named as the module's state dict, so a new version of the same
    network is ``program.apply_weights(module.state_dict())`` away when `weights_replaceable`.
    """
    state_sizes = _state_sizes(module)
    _, outputs = _signature(observation_space, action_space, state_sizes)
    example = _feed(observation_space, batch_space(observation_space, 2).sample(),
                    {name: np.zeros((2, size), np.float32) for name, size in state_sizes.items()})
    batch = torch.export.Dim(BATCH)
    with torch.no_grad(), _quiet():
        program = torch.onnx.export(
            module, tuple(torch.as_tensor(value) for value in example.values()), dynamo=True, verbose=False,
            input_names=list(example), output_names=[output["name"] for output in outputs],
            dynamic_shapes=(tuple({0: batch} for _ in example),))
    return program


def weights_replaceable(program, module: torch.nn.Module) -> bool:
    """Whether every tensor of ``module``'s state dict is an initializer of ``program`` by name. The
    exporter folds some into constants (an LSTM's two biases become one): such a graph must be
    exported again for new weights, since ``apply_weights`` would leave those stale."""
    return set(module.state_dict()) <= set(program.model.graph.initializers)


def _state_sizes(module: torch.nn.Module) -> dict[str, int]:
    return {name: int(size) for name, size in getattr(module, "state_sizes", {}).items()}


def _signature(observation_space: gym.Space, action_space: gym.Space,
               state_sizes: dict[str, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The graph's inputs (observation leaves, then states) and outputs (actions, then new states)."""
    inputs = [{"name": field_name("obs", key), "leaf": key, "shape": [BATCH, *leaf.shape],
               "dtype": np.dtype(leaf.dtype).name} for key, leaf in leaf_spaces(observation_space).items()]
    outputs = [{"name": "action", "shape": [BATCH, *action_space.shape], "dtype": np.dtype(action_space.dtype).name}]
    for name, size in state_sizes.items():
        inputs.append({"name": STATE_IN.format(name), "state": name, "shape": [BATCH, size], "dtype": "float32"})
        outputs.append({"name": STATE_OUT.format(name), "state": name, "shape": [BATCH, size], "dtype": "float32"})
    return inputs, outputs


def _feed(observation_space: gym.Space, obs: Any, states: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's inputs by name: observations as a vector env returns them, then the states [B, size]."""
    feed = {field_name("obs", key): array for key, array in leaf_arrays(observation_space, obs).items()}
    return {**feed, **{STATE_IN.format(name): value for name, value in states.items()}}


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's progress lines, warnings and log messages (a failure still raises)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _verify(path: Path, trained: TrainedPolicy, observation_space: gym.Space, action_space: gym.Space,
            state_sizes: dict[str, int]) -> dict[str, Any] | None:
    """Run the written file next to ``act(obs, 0.0)`` over a few steps of sampled observations, with
    some envs' episodes restarting midway; ExportError on the first difference. None without onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    original = trained.policy  # a twin with the same weights and fresh memory and random state
    policy = original.spec.make_policy(device="cpu", seed=trained.seed)
    policy.load_policy_state_dict(original.policy_state_dict())
    space = batch_space(observation_space, VERIFY_ENVS)
    space.seed(trained.seed)
    states = {name: np.zeros((VERIFY_ENVS, size), np.float32) for name, size in state_sizes.items()}
    for step in range(VERIFY_STEPS):
        restart = np.arange(VERIFY_ENVS) % VERIFY_STEPS == step if step else np.ones(VERIFY_ENVS, bool)
        policy.reset_memory(restart)
        for value in states.values():
            value[restart] = 0.0
        obs = space.sample()
        expected = policy.act(obs, 0.0)
        got, *new = session.run(None, _feed(observation_space, obs, states))
        states = dict(zip(state_sizes, new))
        if got.dtype != expected.dtype or got.shape != expected.shape:
            raise ExportError(f"{path} gives actions of {got.dtype} {got.shape}, the policy {expected.dtype} "
                              f"{expected.shape}")
        same = (np.isclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE) if expected.dtype.kind == "f"
                else got == expected)
        if not same.all():
            raise ExportError(f"{path} does not act as the policy: {int((~same).sum())} of {same.size} action values "
                              f"differ at step {step}")
    return {"runtime": f"onnxruntime {onnxruntime.__version__}", "envs": VERIFY_ENVS, "steps": VERIFY_STEPS}
