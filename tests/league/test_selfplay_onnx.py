"""Self-play for actors in any language: a stream that asks for ONNX policies (``Hello.policy_format =
"onnx"``) gets each league snapshot as an ONNX model, before the menu that names it, and each model,
run by onnxruntime where ``import actorlearner`` fails, plays as the snapshot's state dict does."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import numpy as np

from actorlearner import wire
from actorlearner.algorithms import make_config, resolve
from actorlearner.envs import make_env
from actorlearner.envs.multiagent import seat_spaces
from actorlearner.league import SELF
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from league_streams import snapshots_then_menu, spec_fields, ttt_batch, ttt_hello
from multiagent_envs import RANDOM, TICTACTOE
from procs import CHILD_ENV, WITHOUT_ACTORLEARNER, start_learner, stop
from streams import RawStream

# Runs each model on the observations in the .npz given (one array per model input, by the input's name, as
# learner.proto names observation fields) and writes each model's actions, by its file name, to an .npz.
CHILD = WITHOUT_ACTORLEARNER + """
import numpy as np
import onnxruntime

written, given, *models = sys.argv[1:]
feed = dict(np.load(given))
actions = {}
for model in models:
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["action"]
    actions[model.rsplit("/", 1)[-1]] = session.run(["action"], {i.name: feed[i.name] for i in session.get_inputs()})[0]
np.savez(written, **actions)
assert "torch" not in sys.modules
"""


def boards(count: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` random tic-tac-toe positions as a player sees them, as a batch of the observation's leaves."""
    rng = np.random.default_rng(seed)
    marks = rng.integers(0, 3, (count, 9))
    marks[np.arange(count), rng.integers(0, 9, count)] = 0  # a move left in every position
    planes = np.concatenate([marks == 1, marks == 2, marks == 0], axis=1).astype(np.float32)
    return {"obs/observation": planes, "obs/action_mask": (marks == 0).astype(np.int8)}


def onnx_actions(tmp_path, models: dict[str, bytes], observations: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for name, model in models.items():
        (tmp_path / name).write_bytes(model)
    np.savez(tmp_path / "boards.npz", **observations)
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "actions.npz"), str(tmp_path / "boards.npz"),
                           *(str(tmp_path / name) for name in models)],
                          capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(tmp_path / "actions.npz"))


def state_dict_actions(spec: pb.LearnerSpec, payload: bytes, observations: dict[str, np.ndarray]) -> np.ndarray:
    """The greedy actions of the learner's algorithm with a snapshot's state dict loaded."""
    env = make_env(TICTACTOE)
    spaces = seat_spaces(env)
    algorithm = resolve(spec.algorithm)
    policy = algorithm(*spaces, make_config(algorithm, json.loads(spec.algorithm_config))).make_policy(device="cpu")
    policy.load_policy_state_dict(wire.decode_state_dict(payload))
    leaves = {"observation": observations["obs/observation"], "action_mask": observations["obs/action_mask"]}
    return policy.act(leaves, 0.0)


def test_an_onnx_self_play_stream_gets_each_snapshot_as_a_model_that_plays_as_its_state_dict(tmp_path):
    learner, port = start_learner("--env", TICTACTOE, "--league-scripted", RANDOM, "--league-snapshot-every", "2",
                                  "--publish-every", "1", "--min-replay-size", "64", "--batch-size", "32",
                                  "--max-updates", "4", "--eval-every", "0", "--dqn-hidden-sizes", "32,32")
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as channel:
            spec = pb_grpc.LearnerStub(channel).GetSpec(pb.LearnerSpecRequest(), timeout=30)
        onnx = RawStream(address, ttt_hello("onnx-player", policy_format="onnx"))
        welcome = onnx.next("welcome").welcome
        assert welcome.settings.league.enabled and not welcome.settings.actor_priorities
        feeder = RawStream(address, ttt_hello("state-dict-player"))
        assert feeder.next("welcome").welcome.settings.league.enabled
        for seq in range(1, 11):  # past --min-replay-size: 4 updates, snapshots of versions 2 and 4
            feeder.send(ttt_batch(spec_fields(spec), seq, [], [RANDOM, SELF]))
        models, menu = snapshots_then_menu(onnx, 4)
        assert menu == [SELF, RANDOM, "v2", "v4"] and sorted((s, v) for s, v, _ in models) == [("v2", 2), ("v4", 4)]
        state_dicts, menu = snapshots_then_menu(feeder, 4)
        assert menu == [SELF, RANDOM, "v2", "v4"]

        observations = boards(256, seed=3)
        played = onnx_actions(tmp_path, {f"{s}.onnx": payload for s, _, payload in models}, observations)
        for snapshot, _, payload in state_dicts:
            expected = state_dict_actions(spec, payload, observations)
            np.testing.assert_array_equal(played[f"{snapshot}.onnx"], expected)
            assert observations["obs/action_mask"][np.arange(256), expected].all()  # legal moves only
            assert len(set(expected)) > 3  # the comparison says something
        onnx.close()
        feeder.close()
    finally:
        codes = stop(learner)
    assert codes == [0]
