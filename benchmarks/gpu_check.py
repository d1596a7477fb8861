"""One command for a lent GPU: the CUDA tests, the learner benchmark with capture required, a system run
of 8 actors, and pixel learning with the defaults (MinAtar Breakout, Pong), in that order, every figure
into one Markdown file.

    python3 benchmarks/gpu_check.py                 # writes $OUT/gpu_check.md if OUT is set, else ./gpu_check.md
    python3 benchmarks/gpu_check.py PATH            # writes PATH
    python3 benchmarks/gpu_check.py --dry-run       # prints the commands, in order, with their budgets; runs nothing

It needs CUDA, torch, Triton and the packages benchmarks/GPU.md lists, and installs nothing. Each step
has a time budget: 10 s before it ends the step's whole process group gets SIGTERM (``run`` then
stops and still prints its figures), at its end SIGKILL; the budgets add up to at most 9 minutes.
The steps run from the repository root, with it on PYTHONPATH. The file is rewritten after each
step. Exit status 0 when every step succeeded, 1 otherwise (the file says which failed and why).

The CUDA tests run with ``--continue-on-collection-errors``: pytest imports every test module to
select ``-m cuda``, and a module that cannot be imported here (a package only non-CUDA tests use,
such as imageio-ffmpeg, whose wheel is too large to carry) is listed as not collected instead of
stopping the run; the step fails on any failed test or any other error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOTAL_BUDGET = 540  # seconds, all steps together: one call of the lent machine (10 minutes at most)
GRACE = 10  # a step gets SIGTERM this long before its budget ends, SIGKILL at its end


@dataclass
class Step:
    kind: str  # tests, bench or run: how its output is read
    title: str
    budget: int  # seconds
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    json_path: str | None = None  # bench_learner's --json

    def command(self) -> str:
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


def steps(python: str, scratch: str) -> list[Step]:
    bench = [python, "benchmarks/bench_learner.py", "--device", "cuda", "--capture", "require"]
    learner_json, replay_json = f"{scratch}/bench_learner.json", f"{scratch}/bench_replay.json"
    return [
        Step("tests", "CUDA tests", 150, [python, "-m", "pytest", "-q", "-m", "cuda", "--continue-on-collection-errors",
                                 "tests/"], {"TRITON_INTERPRET": "0"}),
        Step("bench", "Learner step (bench_learner.py)", 75,
             [*bench, "--cases", "dqn-minatar,r2d2-cartpole,sac-halfcheetah", "--runs", "3", "--seconds", "1",
              "--profile-steps", "50", "--json", learner_json], json_path=learner_json),
        Step("bench", "Replay sample+update (bench_learner.py)", 45,
             [*bench, "--cases", "replay-1M,replay-10M", "--batch-sizes", "256,4096", "--runs", "3",
              "--replay-seconds", "0.5", "--json", replay_json], json_path=replay_json),
        Step("run", "System run: MinAtar Breakout, 8 actors x 8 envs, 100 s", 115,
             [python, "-m", "actorlearner", "run", "--port", "0",
              "--env", "MinAtar/Breakout-v1", "--actors", "8", "--num-envs", "8",
              "--device", "cuda", "--max-seconds", "100", "--target-return", "1e9", "--no-plot",
              "--no-checkpoint-replay", "--run-dir", f"{scratch}/run"]),
        *(Step("run", f"Pixel learning with the defaults: {env}, 60 s", 75,
               [python, "-m", "actorlearner", "run", "--port", "0", "--env", env, "--max-seconds", "60",
                "--target-return", "1e9", "--no-plot", "--run-dir", f"{scratch}/{env.replace('/', '_')}"])
          for env in ("MinAtar/Breakout-v1", "ALE/Pong-v5")),
    ]


@dataclass
class Outcome:
    rc: int | None  # None: stopped (SIGTERM at its budget less GRACE)
    seconds: float
    stdout: str
    stderr: str


def execute(step: Step) -> Outcome:
    """Run one step in a process group of its own, stopped with all its children at its budget."""
    env = {**os.environ, **step.env, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    began = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(step.argv, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        rc: int | None = None
        try:
            rc = proc.wait(timeout=step.budget - GRACE)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        _signal_group(proc, signal.SIGKILL)  # children it left behind
        out.seek(0), err.seek(0)
        return Outcome(rc, time.monotonic() - began, out.read(), err.read())


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tests_section(outcome: Outcome) -> tuple[bool, list[str]]:
    """Pytest's summary line, its failures and errors; ok when nothing failed and every error is a
    module that could not be collected."""
    lines = outcome.stdout.splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|deselected|error)", ln)),
                   "(no summary line)")
    failed = [ln for ln in lines if ln.startswith("FAILED ")]
    errors = [ln for ln in lines if ln.startswith("ERROR ")]
    uncollected = [ln for ln in errors if "::" not in ln]
    ok = outcome.rc == 0 or (outcome.rc == 1 and not failed and len(uncollected) == len(errors))
    text = [f"Summary: `{summary.strip()}`", ""]
    if failed or errors:
        text += ["```", *failed, *errors, "```", ""]
    if uncollected:
        reasons = sorted(set(re.findall(r"^E\s+((?:ModuleNotFound|Import)Error: .*)$", outcome.stdout, re.M)))
        text += [f"Not collected ({len(uncollected)} modules pytest could not import): " + "; ".join(reasons), ""]
    return ok, text


def bench_section(step: Step, outcome: Outcome) -> tuple[bool, list[str]]:
    """bench_learner's tables (all it prints after its per-case lines), its capture failures, and its JSON."""
    lines = outcome.stdout.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("| case |")), len(lines))
    text = [*lines[first:], ""] if first < len(lines) else ["(no table: the step did not finish)", ""]
    text += [f"    {ln}" for ln in outcome.stderr.splitlines() if ln.startswith("FAILED:")]
    if step.json_path and os.path.exists(step.json_path):
        with open(step.json_path) as f:
            report = f.read().strip()
        meta = json.loads(report)
        text = [f"Device {meta['device']} ({meta.get('gpu') or 'no GPU name'}), torch {meta['torch']}, "
                f"--capture {meta.get('capture')}", "", *text,
                "", "<details><summary>JSON</summary>", "", "```json", report, "```", "</details>", ""]
    return outcome.rc == 0, text


def parse_human(text: str) -> float:
    """A number as actorlearner.telemetry.human writes it: 950, 12.3k, 1.5M, 2G."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(text[-1], 1.0)
    return float(text[:-1] if text[-1] in "kMG" else text) * scale


def run_section(outcome: Outcome) -> tuple[bool, list[str]]:
    """Updates/s and env steps/s: over the whole run (its final JSON line) and over the progress lines
    once training had started (run prints one to stderr every 2 s)."""
    result = None
    for line in reversed(outcome.stdout.splitlines()):
        try:
            result = json.loads(line) if line.startswith("{") else None
        except ValueError:
            continue
        if result:
            break
    progress = []  # (seconds, env steps, updates)
    for line in outcome.stderr.splitlines():
        m = re.match(r"\[\s*([\d.]+)s\] steps ([\d.]+[kMG]?) .*\| updates ([\d.]+[kMG]?)", line)
        if m:
            progress.append((float(m[1]), parse_human(m[2]), parse_human(m[3])))
    text = []
    if result:
        s = result["seconds"]
        text += ["| figure | value |", "|---|---:|",
                 f"| seconds (the learner's start to its stop, the actors' stop included) | {s:,.1f} |",
                 f"| env steps | {result['env_steps']:,} |", f"| updates | {result['updates']:,} |",
                 f"| **env steps/s** (whole run) | **{result['env_steps'] / s:,.0f}** |",
                 f"| **updates/s** (whole run) | **{result['updates'] / s:,.1f}** |"]
        training = [p for p in progress if p[2] > 0]
        if len(training) >= 2 and training[-1][0] > training[0][0]:
            (t0, e0, u0), (t1, e1, u1) = training[0], training[-1]
            text += [f"| env steps/s, {t0:.0f}-{t1:.0f} s (progress lines, 3 digits) | {(e1 - e0) / (t1 - t0):,.0f} |",
                     f"| updates/s, {t0:.0f}-{t1:.0f} s (progress lines, 3 digits) | {(u1 - u0) / (t1 - t0):,.1f} |"]
        text += ["", "```", json.dumps(result), "```"]
    else:
        text += ["(no result line: the run did not finish)"]
    last = [ln for ln in outcome.stderr.splitlines() if re.match(r"\[\s*[\d.]+s\] ", ln)][-3:]
    errors = [ln for ln in outcome.stderr.splitlines() if " ERROR " in ln or ln.startswith("Traceback")]
    text += ["", "Last progress lines:", "```", *last, "```"]
    text += ["Errors:", "```", *errors[:20], "```"] if errors else []
    return outcome.rc in (0, 1) and result is not None, [*text, ""]


def commit() -> str:
    """The checkout's commit, read from .git (no git needed); 'unknown' without one."""
    try:
        head = (ROOT / ".git" / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            return (ROOT / ".git" / head[5:]).read_text().strip()[:12]
        return head[:12]
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = os.path.join(os.environ["OUT"], "gpu_check.md") if os.environ.get("OUT") else "gpu_check.md"
    parser.add_argument("output", nargs="?", default=default, help=f"the Markdown file to write (here: {default})")
    parser.add_argument("--dry-run", action="store_true", help="print the commands with their budgets; run nothing")
    args = parser.parse_args()
    # A new folder each time: a run directory that already holds a checkpoint would resume from it.
    scratch = os.path.join(tempfile.gettempdir(), f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    plan = steps(sys.executable, scratch)
    total = sum(s.budget for s in plan)
    assert total <= TOTAL_BUDGET, total
    if args.dry_run:
        print(f"# gpu_check: {len(plan)} steps in {ROOT}, budgets {' + '.join(str(s.budget) for s in plan)} = "
              f"{total} s (at most {TOTAL_BUDGET}); output {os.path.abspath(args.output)}; scratch {scratch} "
              "(new on each invocation)")
        for i, s in enumerate(plan, 1):
            print(f"[{i}/{len(plan)}] {s.title} (budget {s.budget} s): {s.command()}")
        return 0
    os.makedirs(scratch)
    head = [f"# GPU check, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}", "",
            f"Commit {commit()}, host {platform.node()}, Python {platform.python_version()}; "
            f"`{shlex.join(['python3', *sys.argv])}`: {len(plan)} steps, budgets adding up to {total} s; "
            f"scratch files (bench JSON, the run's directory) in {scratch}.", ""]
    body, logs, all_ok = [], [], True
    for i, step in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {step.title} (budget {step.budget} s): {step.command()}", flush=True)
        outcome = execute(step)
        if step.kind == "tests":
            ok, text = tests_section(outcome)
        elif step.kind == "bench":
            ok, text = bench_section(step, outcome)
        else:
            ok, text = run_section(outcome)
        how = f"exit {outcome.rc}" if outcome.rc is not None else f"stopped: SIGTERM at {step.budget - GRACE} s"
        status = "ok" if ok and outcome.rc is not None else "FAILED"
        all_ok &= status == "ok"
        print(f"    {status}: {how}, ended after {outcome.seconds:.0f} s", flush=True)
        body += [f"## {i}. {step.title}: {status}", "", f"`{step.command()}`", "",
                 f"{how}, ended after {outcome.seconds:.0f} s (budget {step.budget} s)", "", *text]
        logs += [f"<details><summary>{i}. {step.title}: the last 40 lines of stdout, then of stderr</summary>", "",
                 "```", *outcome.stdout.splitlines()[-40:], "```", "```", *outcome.stderr.splitlines()[-40:], "```",
                 "</details>", ""]
        with open(args.output, "w") as f:  # after every step: what was measured survives a later stop
            f.write("\n".join([*head, *body, "## Logs", "", *logs]) + "\n")
    print("\n".join([*head, *body]))
    print(f"gpu_check: {'every step ok' if all_ok else 'a step FAILED'}; wrote {os.path.abspath(args.output)}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
