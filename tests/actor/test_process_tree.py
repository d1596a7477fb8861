"""Every process an actor or ``run`` starts ends with it, by any signal: Atari-sized observations (4 envs of
stacked 84x84 frames, 113 KB a step) stream in every vector mode, and after SIGKILL or
SIGTERM of the actors no process below them is left; an actor whose env stopped answering still ends on
SIGTERM, its children with it; the actors ``run`` started end when ``run`` is SIGKILLed.

On 5c6f918 the ahead actor never sent a batch of these observations, and a SIGKILLed actor's loop process
(and its resource tracker) ran on for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from procs import (CHILD_ENV, LISTENING, NOT_TRAINING, alive, descendants, process_report, start_actor,
                   start_learner, status, status_if, stop, wait_until)

ATARI = ["--frame-stack", "4", "--num-envs", "4"]
LIGHT = ["--actor-batch-size", "32", "--no-actor-priorities"]  # a first batch after a few steps
MODES = ("sync", "async", "workers", "ahead")
SPAWNING = ("async", "workers", "ahead")  # the modes that start processes


def first_batches(port: int, actors: dict[str, subprocess.Popen]) -> None:
    """Wait until the learner stored a batch from each of ``actors`` (by actor id)."""
    def stored():
        return set(actors) <= {a.actor_id for a in status(port).actors if a.inserted}
    wait_until(stored, 180, f"a stored batch from each of {', '.join(actors)}")
    assert all(actor.poll() is None for actor in actors.values())


def below(actors: dict[str, subprocess.Popen]) -> dict[int, str]:
    """Every process below ``actors`` (by id: MODE-...), once each spawning mode has started its children."""
    def found():
        tree = {name: descendants(actor.pid) for name, actor in actors.items()}
        return tree if all(tree[name] for name in actors if name.split("-")[0] in SPAWNING) else None
    tree = wait_until(found, 60, "the actors' child processes")
    return {pid: started for processes in tree.values() for pid, started in processes.items()}


def test_atari_sized_observations_stream_in_every_mode_and_no_process_outlives_its_actor():
    """One actor of each vector mode streams; then each spawning mode's actors get SIGKILL and SIGTERM (weights of
    100 MB through the loop process: test_loop_sizes.py)."""
    learner, port = start_learner("--env", "custom_envs:atari_frames", "--frame-stack", "4", *LIGHT, *NOT_TRAINING)
    signals = {f"{mode}-{sig.name}": sig for mode in SPAWNING for sig in (signal.SIGKILL, signal.SIGTERM)}
    signals["sync-SIGTERM"] = signal.SIGTERM
    actors, children = {}, {}
    try:
        actors = {name: start_actor(port, name, "--env", "custom_envs:atari_frames", *ATARI,
                                    "--vector-mode", name.split("-")[0]) for name in signals}
        first_batches(port, actors)
        children = below(actors)
        for name, actor in actors.items():
            actor.send_signal(signals[name])
        codes = {name: actor.wait(120) for name, actor in actors.items()}
        assert codes == {name: -sig if sig == signal.SIGKILL else 0 for name, sig in signals.items()}
        wait_until(lambda: not alive(children), 60, f"no process left of {sorted(children)}")
    finally:
        stop(*actors.values(), learner)
        kill(children)


def test_an_actor_whose_env_stopped_answering_ends_on_sigterm_and_its_children_with_it(tmp_path):
    """The envs hang in a child (ahead: the loop process; workers: an env worker): SIGTERM still ends the
    actor, which stops waiting for the child and kills it."""
    markers = {mode: tmp_path / mode for mode in ("workers", "ahead")}
    learner, port = start_learner("--env", "custom_envs:hanging_frames", "--frame-stack", "4", *LIGHT, *NOT_TRAINING)
    actors, children = {}, {}
    try:
        for mode in markers:
            actors[f"{mode}-hung"] = subprocess.Popen(
                [sys.executable, "-m", "actorlearner", "actor", "--learner", f"127.0.0.1:{port}", "--actor-id",
                 f"{mode}-hung", "--env", "custom_envs:hanging_frames", *ATARI, "--vector-mode", mode],
                env={**CHILD_ENV, "HANG_MARKER": str(markers[mode])})
        wait_until(lambda: all(m.exists() for m in markers.values()), 180, "both actors' envs to hang")
        children = below(actors)
        for actor in actors.values():
            actor.terminate()
        codes = {name: actor.wait(120) for name, actor in actors.items()}
        assert codes == {"workers-hung": 0, "ahead-hung": 0}
        wait_until(lambda: not alive(children), 60, f"no process left of {sorted(children)}")
    finally:
        stop(*actors.values(), learner)
        kill(children)


def test_the_actors_run_started_end_when_run_is_sigkilled(tmp_path):
    run = subprocess.Popen([sys.executable, "-m", "actorlearner", "run", "--env", "CartPole-v1", "--actors", "2",
                            "--port", "0", "--max-seconds", "600", "--run-dir", str(tmp_path / "run")],
                           stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
    children = {}
    try:
        port = int(LISTENING.search(run.stdout.readline()).group(1))
        wait_until(lambda: status_if(port, lambda s: len([a for a in s.actors if a.inserted]) == 2), 180,
                   "both actors' batches stored")
        children = wait_until(lambda: (tree := descendants(run.pid)) and len(tree) >= 4 and tree, 60,
                              "run's actors and their loop processes")
        run.send_signal(signal.SIGKILL)
        assert run.wait(60) == -signal.SIGKILL
        try:
            wait_until(lambda: not alive(children), 60, f"no process left of {sorted(children)}")
        except AssertionError as exc:  # say which are left, and where they wait
            raise AssertionError(f"{exc}; left: {process_report(children)}") from None
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stdout.close()
        kill(children)


def kill(processes: dict[int, str]) -> None:
    """SIGKILL what is left of ``processes`` (a failed test leaves nothing running)."""
    for pid in alive(processes):
        os.kill(pid, signal.SIGKILL)
