"""benchmarks/gpu_check.py's plan (its dry run, on any machine) and bench_learner.py's refusal of a
case that was to run captured and ran eagerly (on the CPU nothing is captured)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_lists_the_tests_the_bench_and_the_runs_in_order_within_9_minutes(tmp_path) -> None:
    out = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", str(tmp_path / "report.md")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    steps = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert len(steps) >= 3, out.stdout
    assert not (tmp_path / "report.md").exists()  # ran nothing, wrote nothing

    def first(*parts: str) -> int:
        found = [i for i, line in enumerate(steps) if all(p in line for p in parts)]
        assert found, (parts, out.stdout)
        return found[0]

    tests = first("TRITON_INTERPRET=0 ", " -m pytest -q -m cuda ", " tests/")
    benches = [i for i, line in enumerate(steps) if "benchmarks/bench_learner.py" in line]
    assert benches, out.stdout
    for i in benches:
        assert "--device cuda" in steps[i] and "--capture require" in steps[i], steps[i]
    cases = ",".join(re.search(r"--cases (\S+)", steps[i])[1] for i in benches).split(",")
    assert sorted(cases) == sorted(["dqn-minatar", "r2d2-cartpole", "sac-halfcheetah", "replay-1M", "replay-10M"])
    replay = first("--cases replay-1M,replay-10M")
    assert re.search(r"--batch-sizes 256,4096(\s|$)", steps[replay]), steps[replay]
    run = first(" -m actorlearner run ", "--env MinAtar/Breakout-v1", "--actors 8 ", "--num-envs 8 ",
                "--device cuda", "--max-seconds 100")
    assert tests < min(benches) and max(benches) < run, out.stdout

    budgets = [int(re.search(r"\(budget (\d+) s\)", line)[1]) for line in steps]
    assert all(b > 0 for b in budgets) and sum(budgets) <= 540, budgets
    assert budgets[run] > 100, "the 100 s run needs its 100 s and its start and stop"
    pixels = [first(" -m actorlearner run ", f"--env {env} --max-seconds 60") for env in ("MinAtar/Breakout-v1", "ALE/Pong-v5")]
    assert run < pixels[0] < pixels[1] and all(budgets[i] > 60 for i in pixels), "pixel runs with the defaults, last"


def test_bench_learner_fails_when_a_case_asked_to_be_captured_ran_eagerly(tmp_path) -> None:
    report = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "benchmarks/bench_learner.py", "--quick", "--cases", "dqn-cartpole-torch",
                          "--capture", "require", "--json", str(report)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "FAILED: dqn-cartpole-torch was to run captured" in out.stderr, out.stderr
    assert "captures on CUDA only" in out.stderr, out.stderr  # the reason
    assert "| dqn-cartpole-torch | 128 | eager |" in out.stdout, out.stdout  # measured and written first
    written = json.loads(report.read_text())
    assert written["capture_failures"][0]["case"] == "dqn-cartpole-torch"
    assert written["learner"][0]["step"] == "eager" and written["learner"][0]["capture"] is True

    # auto (the default) asks for no capture on the CPU: the same case passes.
    out = subprocess.run([sys.executable, "benchmarks/bench_learner.py", "--quick", "--cases", "dqn-cartpole-torch"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "FAILED" not in out.stderr, out.stdout + out.stderr
