"""Health checks, Prometheus metrics and the SIGTERM drain, on real learner, actor and env-server processes."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time

from actorlearner.envs import RemoteEnv
from probes import health, scrape
from procs import FAST_LEARNER, start_actor, start_learner, stop, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_learner_and_actor_report_health_and_metrics_and_drain_on_sigterm(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret")
    learner_metrics, actor_health, actor_metrics = free_port(), free_port(), free_port()
    learner, port = start_learner(*FAST_LEARNER, "--auth-token-file", str(token), "--metrics-port",
                                  str(learner_metrics), "--checkpoint-dir", str(tmp_path / "ckpt"),
                                  "--replay-capacity", "200000")
    actor = start_actor(port, "watched", "--auth-token-file", str(token), "--health-port", str(actor_health),
                        "--metrics-port", str(actor_metrics))
    try:
        # Probes carry no token: health checks pass the auth interceptor, nothing else does.
        assert health(port) == "SERVING"
        wait_until(lambda: health(actor_health, "connected") == "SERVING", 60, "the actor connected")
        wait_until(lambda: scrape(learner_metrics).get("actorlearner_policy_version", 0) >= 2, 90, "training")
        learned = scrape(learner_metrics)
        assert learned['actorlearner_actor_lag{actor="watched"}'] >= 0
        assert learned["actorlearner_connected_actors"] == 1
        assert learned["actorlearner_buffer_size"] > 0 and learned["actorlearner_updates_total"] > 0
        assert learned["actorlearner_inserts_per_second"] > 0 and learned["actorlearner_samples_per_second"] > 0
        acted = scrape(actor_metrics)
        assert acted["actorlearner_env_steps_total"] > 0 and acted["actorlearner_connected"] == 1
        assert acted["actorlearner_env_steps_per_second"] > 0 and acted["actorlearner_batches_sent_total"] > 0
        assert health(actor_health) == "SERVING"

        learner.send_signal(signal.SIGTERM)
        seen = set()
        deadline = time.monotonic() + 30
        while learner.poll() is None and time.monotonic() < deadline:
            seen.add(health(port))
        assert learner.wait(30) == 0
        assert "NOT_SERVING" in seen, f"health during the drain: {seen}"
        assert list((tmp_path / "ckpt").glob("ckpt-*/manifest.json")), "no final checkpoint"
        # The actor lives on, reconnecting: alive but not connected.
        wait_until(lambda: health(actor_health, "connected") == "NOT_SERVING", 60, "the actor to notice")
        assert health(actor_health) == "SERVING"
    finally:
        codes = stop(actor, learner)
    assert codes[0] == 0


def test_env_server_reports_health_and_metrics():
    metrics_port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "actorlearner", "env-server", "--port", "0", "--metrics-port",
                               str(metrics_port)], stdout=subprocess.PIPE, text=True)
    port = int(re.search(r":(\d+)$", server.stdout.readline().strip()).group(1))
    try:
        assert health(port) == "SERVING"
        env = RemoteEnv(f"127.0.0.1:{port}")
        env.reset(seed=0)
        for _ in range(10):
            env.step(0)
        served = scrape(metrics_port)
        assert served["actorlearner_env_sessions"] == 1 and served["actorlearner_env_steps_total"] >= 10
        env.close()
        wait_until(lambda: scrape(metrics_port)["actorlearner_env_sessions"] == 0, 30, "the session to end")
        assert scrape(metrics_port)["actorlearner_env_sessions_total"] == 1
    finally:
        assert stop(server) == [0]



def test_run_serves_on_its_port_prints_the_address_and_answers_status(tmp_path):
    """``run --port N`` serves on N (as ``run --help`` says), prints where, and ``status`` reaches it there."""
    port = free_port()
    run = subprocess.Popen([sys.executable, "-m", "actorlearner", "run", "--host", "127.0.0.1", "--port", str(port),
                            *FAST_LEARNER, "--actors", "1", "--num-envs", "2", "--max-seconds", "300",
                            "--vector-mode", "sync",
                            "--run-dir", str(tmp_path / "run"), "--no-plot"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert run.stdout.readline().strip() == f"learner listening on 127.0.0.1:{port}"

        def actor_counted() -> bool:
            shown = subprocess.run([sys.executable, "-m", "actorlearner", "status", "--learner", f"127.0.0.1:{port}",
                                    "--json"], capture_output=True, text=True, timeout=60)
            return shown.returncode == 0 and json.loads(shown.stdout)["env_steps"] > 0

        wait_until(actor_counted, 120, "status to show the run's actor stepping")
        run.send_signal(signal.SIGINT)
        assert run.wait(60) == 1  # stopped before solving
    finally:
        stop(run)
