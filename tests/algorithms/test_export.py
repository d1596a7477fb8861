"""``actorlearner export``: the ONNX file acts as the checkpoint's greedy policy, run by onnxruntime in
a process where ``import actorlearner`` fails, for every algorithm that has ``export_policy``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from google.protobuf.json_format import ParseDict
from gymnasium.vector.utils import batch_space

from actorlearner.algorithms.dqn import DQNConfig
from actorlearner.algorithms.r2d2 import R2D2Config
from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.export import export_onnx
from actorlearner.learner.learner import Learner
from actorlearner.networks import leaf_arrays
from actorlearner.specs import space_from_proto
from actorlearner.trained import load_trained
from actorlearner.v1 import env_pb2
from procs import CHILD_ENV, WITHOUT_ACTORLEARNER, run_command

# Reads the model's sidecar as a user in another language would, steps the model through the observations
# in DATA (leaf inputs [T, E, ...] and "restart" [T, E]: envs whose episodes begin, their states zeroed) and
# writes the actions [T, E, ...]; each step also runs the first env alone (a batch of 1) and checks it agrees.
CHILD = WITHOUT_ACTORLEARNER + """
import json
import numpy as np
import onnxruntime

model, data, written = sys.argv[1:]
sidecar = json.load(open(model + ".json"))
session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
given = np.load(data)
restart = given["restart"]
states = {i["name"]: np.zeros((restart.shape[1], i["shape"][1]), np.float32) for i in sidecar["inputs"] if "state" in i}
actions = []
for t in range(len(restart)):
    for value in states.values():
        value[restart[t]] = 0.0
    feed = {**{i["name"]: given[i["name"]][t] for i in sidecar["inputs"] if "leaf" in i}, **states}
    outputs = session.run(None, feed)
    alone = session.run(None, {name: value[:1] for name, value in feed.items()})
    for one, all_ in zip(alone, outputs):
        np.testing.assert_allclose(one, all_[:1], rtol=1e-5, atol=1e-6)
    actions.append(outputs[0])
    states = {o["name"].replace("next_", "", 1): value for o, value in zip(sidecar["outputs"][1:], outputs[1:])}
np.save(written, np.stack(actions))
assert "torch" not in sys.modules
"""


def checkpointed(run_dir: Path, env: str, algorithm: str = "dqn", config=None) -> Path:
    """A run directory with one learner checkpoint whose policy network has large random weights and zero
    biases, so that greedy actions vary with the observation (and, in R2D2, with the state)."""
    learner = Learner(LearnerConfig(env=env, algorithm=algorithm, algorithm_config=config, eval_every=0,
                                    replay_capacity=1000, checkpoint_replay=False,
                                    checkpoint_dir=str(run_dir / "checkpoints")))
    network = learner.trainer.actor if hasattr(learner.trainer, "actor") else learner.trainer.online
    generator = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for param in network.parameters():
            if param.dim() == 1:
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 2 / param[0].numel() ** 0.5)
    learner.checkpoint()
    return run_dir


def sampled(space, envs: int, steps: int) -> list:
    """``steps`` batches of ``envs`` observations, as a vector env returns them."""
    batched = batch_space(space, envs)
    batched.seed(1)
    return [batched.sample() for _ in range(steps)]


def onnx_actions(model: Path, space, observations: list, restart: np.ndarray) -> np.ndarray:
    """The exported model's actions [T, E, ...] from a process where ``import actorlearner`` fails."""
    sidecar = json.loads(Path(f"{model}.json").read_text())
    leaves = [leaf_arrays(space, obs) for obs in observations]
    data = {i["name"]: np.stack([step[i["leaf"]] for step in leaves]) for i in sidecar["inputs"] if "leaf" in i}
    np.savez(model.parent / "given.npz", restart=restart, **data)
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), str(model.parent / "given.npz"),
                           str(model.parent / "written.npy")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(model.parent / "written.npy")


def greedy_actions(policy, observations: list, restart: np.ndarray) -> np.ndarray:
    """The algorithm's own ``act(obs, 0.0)`` over the same steps, its memory (if any) reset as in ``restart``."""
    actions = []
    for obs, starting in zip(observations, restart):
        policy.reset_memory(starting)
        actions.append(policy.act(obs, 0.0))
    return np.stack(actions)


def test_the_cli_exports_a_dqn_policy_that_acts_greedily_without_actorlearner(tmp_path):
    run_dir = checkpointed(tmp_path / "run", "CartPole-v1")
    out = tmp_path / "exported" / "cartpole.onnx"
    done = run_command([sys.executable, "-m", "actorlearner", "export", "--checkpoint", str(run_dir),
                        "--out", str(out), "--json"], timeout=120, env=CHILD_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(done.stdout.strip().splitlines()[-1])
    assert written == {"onnx": str(out), "sidecar": f"{out}.json",
                       "verified": {"runtime": written["verified"]["runtime"], "envs": 32, "steps": 4}}
    assert written["verified"]["runtime"].startswith("onnxruntime ")

    trained = load_trained(run_dir)
    sidecar = json.loads(Path(f"{out}.json").read_text())
    env = make_env("CartPole-v1")
    assert sidecar["inputs"] == [{"name": "obs", "leaf": "", "shape": ["batch", 4], "dtype": "float32"}]
    assert sidecar["outputs"] == [{"name": "action", "shape": ["batch"], "dtype": "int64"}]
    assert space_from_proto(ParseDict(sidecar["observation_space"], env_pb2.Space())) == env.observation_space
    assert space_from_proto(ParseDict(sidecar["action_space"], env_pb2.Space())) == env.action_space
    model = onnx.load(out)
    assert sidecar["opset"] == next(o.version for o in model.opset_import if o.domain == "")
    assert [i.name for i in model.graph.input] == ["obs"] and [o.name for o in model.graph.output] == ["action"]
    assert (sidecar["format"], sidecar["env"], sidecar["algorithm"]) == ("onnx", "CartPole-v1", "dqn")
    assert (sidecar["checkpoint"], sidecar["updates"], sidecar["recurrent_state"]) == (str(trained.source), 0, None)

    observations = sampled(env.observation_space, 64, 1)
    restart = np.ones((1, 64), bool)
    actions = onnx_actions(out, env.observation_space, observations, restart)
    expected = greedy_actions(trained.policy, observations, restart)
    assert actions.dtype == expected.dtype and len(np.unique(expected)) == 2
    np.testing.assert_array_equal(actions, expected)


def test_dict_image_observations_and_branched_actions_export_as_raw_env_values(tmp_path):
    env_id = "custom_envs:goal_image"
    trained = load_trained(checkpointed(tmp_path / "run", env_id, config=DQNConfig(hidden_sizes=(32,))))
    out = tmp_path / "goal.onnx"
    sidecar = export_onnx(trained, out)
    assert [(i["name"], i["dtype"]) for i in sidecar["inputs"]] == [
        ("obs/image", "uint8"), ("obs/position", "float32"), ("obs/noise_discrete", "int64"),
        ("obs/noise_bits", "int8"), ("obs/noise_tuple/0", "int64"), ("obs/noise_tuple/1", "float32")]
    assert sidecar["outputs"] == [{"name": "action", "shape": ["batch", 2], "dtype": "int64"}]

    space = make_env(env_id).observation_space
    observations = sampled(space, 48, 2)
    restart = np.ones((2, 48), bool)
    actions = onnx_actions(out, space, observations, restart)
    expected = greedy_actions(trained.policy, observations, restart)
    assert len(np.unique(expected.reshape(-1, 2), axis=0)) > 1
    np.testing.assert_array_equal(actions, expected)


@pytest.mark.parametrize("env_id, core", [("custom_envs:memory_cue", "lstm"), ("custom_envs:dict_walk", "gru")])
def test_recurrent_state_carried_by_the_caller_acts_as_the_algorithm_s_memory(tmp_path, env_id, core):
    config = R2D2Config(core=core, core_size=16, hidden_sizes=(16,))
    trained = load_trained(checkpointed(tmp_path / "run", env_id, "r2d2", config))
    out = tmp_path / "r2d2.onnx"
    sidecar = export_onnx(trained, out)
    names = ("h", "c") if core == "lstm" else ("h",)
    assert sidecar["recurrent_state"] == {"sizes": dict.fromkeys(names, 16), "initial": "zeros at each episode start"}
    assert [i["name"] for i in sidecar["inputs"] if "state" in i] == [f"state/{name}" for name in names]
    assert [o["name"] for o in sidecar["outputs"]] == ["action", *(f"next_state/{name}" for name in names)]

    space = make_env(env_id).observation_space
    envs, steps = 16, 6
    observations = sampled(space, envs, steps)
    restart = np.zeros((steps, envs), bool)
    restart[0] = True
    restart[3, ::2] = True  # half the envs begin new episodes midway
    actions = onnx_actions(out, space, observations, restart)
    expected = greedy_actions(trained.policy, observations, restart)
    np.testing.assert_array_equal(actions, expected)
    memoryless = greedy_actions(trained.policy, observations, np.ones((steps, envs), bool))
    assert (expected != memoryless).any(), "the state makes no difference: the test would not notice a lost one"


@pytest.mark.parametrize("algorithm, env_id", [("sac", "Pendulum-v1"), ("td3", "custom_envs:reach")])
def test_continuous_actions_are_the_evaluation_actions_inside_the_bounds(tmp_path, algorithm, env_id):
    trained = load_trained(checkpointed(tmp_path / "run", env_id, algorithm))
    out = tmp_path / f"{algorithm}.onnx"
    export_onnx(trained, out)
    env = make_env(env_id)
    observations = sampled(env.observation_space, 64, 1)
    restart = np.ones((1, 64), bool)
    actions = onnx_actions(out, env.observation_space, observations, restart)
    expected = greedy_actions(trained.policy, observations, restart)
    assert actions.dtype == expected.dtype == np.float32
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)
    low, high = env.action_space.low, env.action_space.high
    assert ((low <= actions) & (actions <= high)).all()
    assert len(np.unique(expected[0].round(3), axis=0)) > 10


def test_an_algorithm_without_export_policy_is_refused_by_name(tmp_path):
    run_dir = tmp_path / "run"
    Learner(LearnerConfig(env="custom_envs:frozen_lake", algorithm="plugin_algorithm:TabularQ", eval_every=0,
                          replay_capacity=1000, checkpoint_dir=str(run_dir / "checkpoints"))).checkpoint()
    out = tmp_path / "tabq.onnx"
    done = run_command([sys.executable, "-m", "actorlearner", "export", "--checkpoint", str(run_dir),
                        "--out", str(out)], timeout=120, env=CHILD_ENV)
    assert done.returncode == 1
    assert ("algorithm plugin_algorithm:TabularQ has no export_policy; see docs/write-your-own-algorithm.md"
            in done.stderr), done.stderr[-2000:]
    assert not out.exists() and not Path(f"{out}.json").exists()
