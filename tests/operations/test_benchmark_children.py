"""A benchmark's children end with it, SIGKILL included: each process a benchmark starts asks the kernel for
a signal at its parent's death (`lifeline.tied_to_this_process`), as the project's own commands' children do."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

from procs import wait_until

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

STARTER = """
import subprocess, sys, time
from actorlearner.lifeline import tied_to_this_process
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], preexec_fn=tied_to_this_process())
print(child.pid, flush=True)
time.sleep(300)
"""


def gone(pid: int) -> bool:
    """No such process, or only its zombie (its new parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_started_with_the_lifeline_ends_when_its_starter_is_killed():
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    try:
        child = int(starter.stdout.readline())
        assert not gone(child)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(timeout=60)
        wait_until(lambda: gone(child), 60, "the child to end with its starter")
    finally:
        starter.kill()
        starter.wait()


def test_every_process_a_benchmark_starts_is_tied_to_it():
    """Every ``subprocess.Popen``/``run`` call in benchmarks/ passes the lifeline (a git query excepted), and every
    multiprocessing worker ends with its parent; gpu_check.py is the exception: it runs on the system Python of a
    lent machine, importing nothing of the project, each step in its own session killed at its budget."""
    untied = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        if path.name == "gpu_check.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("Popen", "run") and getattr(node.func.value, "id", "") == "subprocess"):
                continue
            git = isinstance(node.args[0], ast.List) and getattr(node.args[0].elts[0], "value", None) == "git"
            if not git and "preexec_fn" not in {keyword.arg for keyword in node.keywords}:
                untied.append(f"{path.name}:{node.lineno}")
    assert not untied
    for name in ("bench_ingest.py", "bench_scale.py"):
        assert "end_with_parent(parent_pid)" in (BENCHMARKS / name).read_text(), name
