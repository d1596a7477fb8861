"""The tests' own process helpers: nothing a test starts outlives the pytest process that ran it, even a
process that the test failed before stopping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from procs import CHILD_ENV, wait_until

FAILING_TEST = """
import os

from procs import start_env_server


def test_fails_before_it_stops_its_env_server():
    server, _ = start_env_server("CartPole-v1")
    with open(os.environ["SERVER_PID_FILE"], "w") as out:
        out.write(str(server.pid))
    raise AssertionError("failed with the env server running")
"""


def test_an_env_server_a_failed_test_left_running_ends_with_its_pytest_worker(tmp_path):
    """An env server has no parent to end with (a user's has none): `procs` ends the ones left as the pytest
    process (here an xdist worker, as under `make test`) exits."""
    (tmp_path / "test_leaves_a_server.py").write_text(FAILING_TEST)
    pid_file = tmp_path / "server.pid"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1",
                           str(tmp_path / "test_leaves_a_server.py")], cwd=tmp_path, capture_output=True, text=True,
                          env={**CHILD_ENV, "SERVER_PID_FILE": str(pid_file)}, timeout=300)
    assert done.returncode == 1 and "failed with the env server running" in done.stdout, done.stdout + done.stderr
    pid = int(pid_file.read_text())
    try:
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30, f"env server {pid} to end with its pytest worker")
    finally:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
