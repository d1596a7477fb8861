"""The learner's step (replay sample -> algorithm update -> new priorities) against the same trainer
run eagerly, a plain few-line torch DQN step, and the replay alone against cpprb.

Learner cases (algorithm, spaces, batch, replay capacity): dqn-cartpole (Box(4,) float32,
Discrete(2), 128, 1M), dqn-cartpole-torch (the same on the torch replay path, kernels="torch"),
dqn-minatar (bench_minatar's Breakout: Box(10, 10, 4) bool, Discrete(6), 128, 100k),
r2d2-cartpole (128 sequences, 100k), sac-halfcheetah (Box(17,) float64, Box(6,) in [-1, 1], 256,
1M). Each replay holds ``--fill`` random items of the spec's fields (random priorities).

- ours: `LearnerStep(trainer, replay, batch)`, metrics read every 100 steps;
- eager: the same trainer and replay step by step, ``replay.sample``, ``trainer.update``,
  ``replay.update_priorities``, the metrics read every step (the learner's loop before LearnerStep);
- plain (dqn-cartpole only): the issue's target, a plain eager torch step written below with torch
  alone (cumsum + searchsorted over a flat priority vector, IS weights, row gather, Huber double
  DQN on a dueling MLP of the spec's sizes, Adam, clipping, the priority scatter), over the same
  stored items; nothing of the project's, whose overhead it would hide.

Each gets its own trainer (same seed) and replay (same items); runs alternate between them; medians
of ``--runs``. Per step also (bench_counts.py): on CPU the torch ops (profiler ``aten::`` events,
nested ones included), the launches (`DeviceLaunches`: torch ops that run a kernel or a copy, Triton
kernels; the compiled replay's numba kernels are neither) and host reads (`HostReads`); on CUDA the
kernels and copies that ran on the device, every launch (kernels, Triton's through the driver,
copies, memsets, graph launches: profiler), the syncs (``torch.cuda.set_sync_debug_mode``) and
host reads. Replay cases (replay-1M, replay-10M): sample(B) + update_priorities(B) against cpprb,
as bench_replay.py does; with ``--device cuda`` ours runs on the GPU, its draw and update replayed
as one captured CUDA graph.

Capture (``--capture``): each row says whether ours ran ``captured`` or ``eager``, read after the
timed runs and the counts (a step can fall back when it is captured, after warm-up). ``auto`` asks
for capture on CUDA wherever it can be had (a capturable trainer with the replay on the device;
every replay case) and nowhere on CPU; ``require`` asks for it in every case; ``off`` never
captures. A case asked to run captured that ran eagerly fails the run: the tables and ``--json``
are written, then each such case and why (LearnerStep's ``capture_error``, the graph's exception),
and the exit status is 1.

    python benchmarks/bench_learner.py --json out.json              # every case, CPU, 1 thread
    python benchmarks/bench_learner.py --quick                      # smoke run
    python benchmarks/bench_learner.py --cases dqn-cartpole,replay-1M --device cuda --capture require
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from bench_counts import COUNT_COLUMNS, per_step, step_counts
from bench_replay import Cpprb, make_fields, random_batch, summarize
from bench_replay import Ours as ReplayOurs

from actorlearner.algorithms.registry import make_spec
from actorlearner.learner.step import LearnerStep
from actorlearner.replay import make_replay

CARTPOLE = gym.spaces.Box(np.array([-4.8, -np.inf, -0.41887903, -np.inf], np.float32),
                          np.array([4.8, np.inf, 0.41887903, np.inf], np.float32), dtype=np.float32)
MINATAR = gym.spaces.Box(0, 1, (10, 10, 4), dtype=bool)  # bench_minatar.breakout()'s observations
CHEETAH_OBS = gym.spaces.Box(-np.inf, np.inf, (17,), dtype=np.float64)  # HalfCheetah-v5's spaces
CHEETAH_ACT = gym.spaces.Box(-1.0, 1.0, (6,), dtype=np.float32)
LEARNER_CASES = {  # name -> (algorithm, observation space, action space, batch, capacity, replay kernels)
    "dqn-cartpole": ("dqn", CARTPOLE, gym.spaces.Discrete(2), 128, 1_000_000, "auto"),
    "dqn-cartpole-torch": ("dqn", CARTPOLE, gym.spaces.Discrete(2), 128, 1_000_000, "torch"),
    "dqn-minatar": ("dqn", MINATAR, gym.spaces.Discrete(6), 128, 100_000, "auto"),
    "r2d2-cartpole": ("r2d2", CARTPOLE, gym.spaces.Discrete(2), 128, 100_000, "auto"),
    "sac-halfcheetah": ("sac", CHEETAH_OBS, CHEETAH_ACT, 256, 1_000_000, "auto"),
}
REPLAY_CASES = {"replay-1M": 1_000_000, "replay-10M": 10_000_000}
READ_EVERY = 100  # ours reads its metrics every this many steps
ALPHA, EPS = 0.6, 1e-6  # the replay's defaults, which the plain step copies


def read_floats(metrics) -> dict[str, float]:
    """Metric values as floats: 0-d tensors in one host read (as trainers did before LearnerStep)."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    values = torch.stack([metrics[k].float() for k in keys]).tolist() if keys else []
    return {**{k: float(v) for k, v in metrics.items() if k not in keys}, **dict(zip(keys, values))}


def eager_step(trainer, replay, batch_size) -> None:
    sample = replay.sample(batch_size)
    priorities, metrics = trainer.update(sample)
    replay.update_priorities(sample.indices, priorities)
    read_floats(metrics)


class ReadingEvery:
    """A LearnerStep called step by step, its metrics read every READ_EVERY steps."""

    def __init__(self, step):
        self.step, self.calls = step, 0

    def __call__(self) -> None:
        self.step()
        self.calls += 1
        if self.calls % READ_EVERY == 0:
            self.step.read_metrics()


class PlainDQN:
    """The issue's baseline, as a user writes it with torch alone: the same network (two hidden layers and a
    dueling head) and the same update as the spec's DQN, for one Discrete action over vector observations."""

    def __init__(self, config, items: dict[str, np.ndarray], priorities: np.ndarray, batch_size: int, device):
        self.config, self.batch, self.device = config, batch_size, torch.device(device)
        self.data = {k: torch.from_numpy(v).to(device) for k, v in items.items()}
        self.prio = torch.from_numpy((priorities + EPS) ** ALPHA).to(device)  # stored as (p + eps) ** alpha
        obs_dim, actions = items["obs"].shape[1], int(items["action"].max()) + 1
        torch.manual_seed(0)
        self.online, self.target = (Dueling(obs_dim, config.hidden_sizes, actions).to(device) for _ in range(2))
        self.target.load_state_dict(self.online.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=config.lr)
        self.updates, self.beta = 0, 0.4

    def __call__(self) -> None:
        c, n, b = self.config, len(self.prio), self.batch
        cum = torch.cumsum(self.prio, 0)  # stratified proportional draws
        idx = torch.searchsorted(cum, (torch.arange(b, device=self.device) + torch.rand(b, device=self.device))
                                 * (cum[-1] / b)).clamp_(max=n - 1)
        weights = (self.prio[idx] / self.prio.min()).pow(-self.beta).float()  # (N P(i))^-beta / max
        obs, a, r, d, next_obs = (self.data[k][idx] for k in ("obs", "action", "reward", "discount", "next_obs"))
        q = self.online(obs)
        with torch.no_grad():
            best = self.online(next_obs).argmax(1, keepdim=True)
            target = r + d * self.target(next_obs).gather(1, best).squeeze(1)
        td = target - q.gather(1, a[:, None]).squeeze(1)
        loss = (weights * F.huber_loss(td, torch.zeros_like(td), reduction="none", delta=c.huber_delta)).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        if self.updates % c.target_update_period == 0:
            self.target.load_state_dict(self.online.state_dict())
        self.prio[idx] = (td.detach().abs() + c.priority_eps + EPS).double().pow(ALPHA)


class Dueling(torch.nn.Module):
    """Plain's network: Linear + ReLU layers, then V(s) + A(s, a) - mean A(s, .)."""

    def __init__(self, inputs: int, hidden: tuple[int, ...], actions: int):
        super().__init__()
        layers, width = [], inputs
        for size in hidden:
            layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
            width = size
        self.torso = torch.nn.Sequential(*layers)
        self.value, self.advantage = torch.nn.Linear(width, 1), torch.nn.Linear(width, actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.torso(x)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(1, keepdim=True)


def random_items(fields, action_space, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` random items of a spec's fields: actions in the action space, discounts in [0.9, 1)."""
    out = {}
    for name, (shape, dtype) in fields.items():
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        if dtype == torch.bool:
            out[name] = rng.random((n, *shape)) < 0.1
        elif name == "action" and isinstance(action_space, gym.spaces.Discrete):
            out[name] = rng.integers(0, action_space.n, size=(n, *shape)).astype(np_dtype)
        elif name == "discount":
            out[name] = rng.uniform(0.9, 1.0, size=(n, *shape)).astype(np_dtype)
        else:
            out[name] = rng.uniform(-1.0, 1.0, size=(n, *shape)).astype(np_dtype)
    return out


def timed(fn, seconds: float, sync) -> tuple[int, float, float]:
    """Calls of ``fn`` in at least ``seconds`` (at least one), synchronizing once at the end; with the wall
    and this thread's CPU seconds they took (CPU time is less moved by other processes on a busy machine)."""
    calls, start, cpu_start = 0, time.perf_counter(), time.thread_time()
    while calls < 1 or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    sync()
    return calls, time.perf_counter() - start, time.thread_time() - cpu_start


def alternate(contenders: dict, runs: int, seconds: float, sync, slices: int = 5) -> tuple[dict, dict]:
    """Each contender's rates (calls per wall second, per CPU second) in each of ``runs`` runs of
    ``seconds``; a run takes turns in ``slices`` slices (who goes first rotates), so that a burst of
    load hits all alike."""
    wall, cpu, names = {name: [] for name in contenders}, {name: [] for name in contenders}, list(contenders)
    for run in range(runs):
        totals = {name: np.zeros(3) for name in contenders}
        for turn in range(slices):
            first = (run * slices + turn) % len(names)
            for name in names[first:] + names[:first]:
                totals[name] += timed(contenders[name], seconds / slices, sync)
        for name, (calls, wall_s, cpu_s) in totals.items():
            wall[name].append(calls / wall_s)
            cpu[name].append(calls / cpu_s)
    return wall, cpu


def build(spec, capacity, kernels, items, priorities, device):
    trainer = spec.make_trainer(device=device)
    replay = make_replay(capacity, spec.transition_fields(), device=device, kernels=kernels)
    n = len(priorities)
    for at in range(0, n, 10_000):
        replay.add({k: v[at:at + 10_000] for k, v in items.items()}, priorities=priorities[at:at + 10_000])
    return trainer, replay


def capture_wanted(args, trainer, replay) -> bool:
    """Whether ``--capture`` asks this case's LearnerStep to run captured."""
    if args.capture != "auto":
        return args.capture == "require"
    return (args.device == "cuda" and trainer.capturable and replay.device_sampling() is not None
            and replay.device.type == "cuda")


def why_eager(step: LearnerStep, args) -> str:
    """Why a LearnerStep ran eagerly: its capture error, or what kept it from trying."""
    if step.capture_error:
        return step.capture_error
    trainer, replay = step.trainer, step.replay
    reasons = ["--capture off"] if args.capture == "off" else []
    if replay.device.type != "cuda":
        reasons.append(f"the replay is on {replay.device.type} (LearnerStep captures on CUDA only)")
    if not trainer.capturable:
        reasons.append(f"{type(trainer).__name__} is not capturable")
    if replay.device_sampling() is None:
        reasons.append(f"the replay is a {type(replay).__name__}, with no device sampling (not the device path)")
    elif torch.device(trainer.device) != replay.device:
        reasons.append(f"the trainer is on {trainer.device}, the replay on {replay.device}")
    return "; ".join(reasons) or "LearnerStep did not capture (no error recorded)"


def learner_case(name: str, args, sync) -> dict:
    algorithm, obs_space, act_space, batch, capacity, kernels = LEARNER_CASES[name]
    device = torch.device(args.device)
    spec = make_spec(algorithm, obs_space, act_space)
    rng = np.random.default_rng(0)
    n = min(args.fill, capacity)
    items = random_items(spec.transition_fields(), act_space, n, rng)
    priorities = rng.random(n) + 0.01
    step = LearnerStep(*build(spec, capacity, kernels, items, priorities, device), batch,
                       capture=False if args.capture == "off" else None)
    contenders = {"ours": ReadingEvery(step)}
    trainer, replay = build(spec, capacity, kernels, items, priorities, device)
    contenders["eager"] = lambda: eager_step(trainer, replay, batch)
    if name == "dqn-cartpole":
        contenders["plain"] = PlainDQN(spec.config, items, priorities, batch, device)
    del items
    for fn in contenders.values():  # warm-up: first calls, a CUDA graph's capture, allocator
        for _ in range(args.warmup):
            fn()
    sync()
    results, cpu = alternate(contenders, args.runs, args.seconds, sync)
    row = {"case": name, "algorithm": algorithm, "batch": batch, "capacity": capacity, "stored": n,
           "replay": kernels if device.type == "cpu" else "device", "runs": results, "cpu_time_runs": cpu}
    row.update({k: statistics.median(v) for k, v in results.items()})
    row["ours/eager"] = row["ours"] / row["eager"]
    row["cpu_time"] = {k: statistics.median(v) for k, v in cpu.items()}
    row["cpu_time"].update({f"ours/{k}": row["cpu_time"]["ours"] / row["cpu_time"][k] for k in cpu if k != "ours"})
    if "plain" in row:
        row["ours/plain"] = row["ours"] / row["plain"]
    steps = max(5, min(args.profile_steps, int(row["eager"] * 2)))  # about 2 s of steps per pass
    row["per_step"] = {"ours": per_step(step, steps, device, sync, step.read_metrics, READ_EVERY),
                       **{k: per_step(fn, steps, device, sync) for k, fn in contenders.items() if k != "ours"}}
    # Read after the timed runs and the counts: a step that fell back at capture (after warm-up) ran eagerly.
    row["step"], row["capture"] = "captured" if step.capture else "eager", capture_wanted(args, trainer, replay)
    row["capture_error"] = None if step.capture else why_eager(step, args)
    return row


class GraphedReplay:
    """Ours on CUDA: the host half (`start_sample` of its `device_sampling()`), then draw + update_priorities
    replayed as one captured CUDA graph; eager device operations when capture fails (``error`` says why) and
    for any call whose ``start_sample`` refuses (``fallbacks`` counts them)."""

    def __init__(self, buffer, batch_size: int):
        self.buffer, self.batch = buffer, batch_size
        self.sampling = buffer.device_sampling()
        self.priorities = torch.rand(batch_size, dtype=torch.float64, device=buffer.device) + 0.01
        self.graph, self.error, self.fallbacks = None, None, 0
        try:
            if self.sampling is None:
                raise RuntimeError(f"a {type(buffer).__name__} has no device sampling")
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self.eager()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if not self.sampling.start_sample(batch_size):
                raise RuntimeError("start_sample refused the draw")
            with torch.cuda.graph(graph):
                sample = self.sampling.draw(batch_size)
                buffer.update_priorities(sample.indices, self.priorities)
            self.graph = graph
        except Exception as exc:  # noqa: BLE001 (report and measure the eager device path instead)
            self.error = f"{type(exc).__name__}: {exc}"
            print(f"CUDA graph capture failed, eager device path: {self.error}", flush=True)

    def eager(self) -> None:
        sample = self.buffer.sample(self.batch)
        self.buffer.update_priorities(sample.indices, self.priorities)

    def __call__(self) -> None:
        if self.graph is not None and self.sampling.start_sample(self.batch):
            self.graph.replay()
        else:
            self.fallbacks += self.graph is not None
            self.eager()

    def why_eager(self) -> str | None:
        """None if every call replayed the graph, else why not."""
        if self.graph is None:
            return self.error
        return f"start_sample refused {self.fallbacks} draws (eager instead)" if self.fallbacks else None


def replay_case(name: str, args, sync) -> list[dict]:
    capacity = REPLAY_CASES[name] if not args.quick else REPLAY_CASES[name] // 10
    fields = make_fields((4,), np.float32)
    rng = np.random.default_rng(0)
    chunk = random_batch(fields, 10_000, rng)
    ours, cpprb = ReplayOurs(capacity, fields, args.device, 16), Cpprb(capacity, fields)
    for buf in (ours, cpprb):
        for _ in range(0, capacity, 10_000):
            buf.add(chunk)
    del chunk
    rows, graphing = [], args.device == "cuda" and args.capture != "off"
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        prio = rng.random(b) + 0.01
        fn = GraphedReplay(ours.buffer, b) if graphing else (lambda: ours.op(b, prio))
        contenders = {"actorlearner": fn, "cpprb": lambda: cpprb.op(b, prio)}
        for f in contenders.values():
            f()
        results = alternate(contenders, args.runs, args.replay_seconds, sync)[0]
        # Read after the timed runs: a call whose draw start_sample refused ran eagerly.
        why = fn.why_eager() if graphing else ("--capture off" if args.capture == "off"
                                               else f"no CUDA graphs on {args.device}")
        rows.append({**summarize(name, f"sample+update B={b}", "ops/s", results), "runs_ops": results,
                     "step": "eager" if why else "captured", "capture_error": why,
                     "capture": args.capture == "require" or (args.capture == "auto" and args.device == "cuda")})
    del ours, cpprb
    gc.collect()
    return rows


def print_tables(learner_rows, replay_rows, device) -> None:
    cuda = device == "cuda"
    if learner_rows:
        print(f"| case | batch | ours ran | ours steps/s | eager steps/s | ours/eager | plain steps/s | ours/plain "
              f"| per step ({COUNT_COLUMNS[cuda]}): ours | eager |\n|---|---:|---|---:|---:|---:|---:|---:|---|---|")
        for r in learner_rows:
            c, ps = r["cpu_time"], r["per_step"]
            plain = f"{r['plain']:,.0f} | **{r['ours/plain']:.2f}x** ({c['ours/plain']:.2f}x)" if "plain" in r \
                else " | "
            print(f"| {r['case']} | {r['batch']} | {r['step']} | {r['ours']:,.1f} | {r['eager']:,.1f} "
                  f"| **{r['ours/eager']:.2f}x** ({c['ours/eager']:.2f}x) | {plain} | {step_counts(ps['ours'], cuda)} "
                  f"| {step_counts(ps['eager'], cuda)} |")
        print("(in parentheses: the same ratio of rates per second of the thread's CPU time)")
    if replay_rows:
        print(f"\n| case | operation | actorlearner ran | actorlearner ({device}) | cpprb (cpu) | ratio |\n"
              "|---|---|---|---:|---:|---:|")
        for r in replay_rows:
            print(f"| {r['case']} | {r['operation']} | {r['step']} | {r['ours']:,.0f} | {r['cpprb']:,.0f} "
                  f"| **{r['ratio']:.2f}x** |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    every = [*LEARNER_CASES, *REPLAY_CASES]
    parser.add_argument("--cases", default=",".join(every), help="comma-separated: " + ", ".join(every))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where ours runs (cpprb: CPU)")
    parser.add_argument("--capture", default="auto", choices=("auto", "require", "off"),
                        help="run ours in CUDA graphs: auto (on CUDA where the trainer is capturable and the "
                        "replay on the device; never on CPU), require (every case), off (never); a case asked "
                        "to run captured that ran eagerly fails the run (exit 1, after the tables and --json)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds each contender runs in each learner run")
    parser.add_argument("--replay-seconds", type=float, default=1.0,
                        help="seconds each contender runs in each replay run")
    parser.add_argument("--fill", type=int, default=50_000,
                        help="random items stored before a learner case (at most its capacity)")
    parser.add_argument("--batch-sizes", default="256,4096,32768", help="replay cases' B")
    parser.add_argument("--warmup", type=int, default=10, help="learner steps of each contender before timing")
    parser.add_argument("--profile-steps", type=int, default=100,
                        help="steps counted per pass for ops, launches, syncs and host reads (fewer when a "
                        "step is slow: about 2 s of eager steps, at least 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run of 0.3 s (replay: 0.2 s), fill "
                        "at most 5,000, 3 warm-up steps, 5 counted, replay capacities N / 10")
    parser.add_argument("--json", metavar="PATH", help="write every figure (and each run's) here")
    args = parser.parse_args()
    cases = args.cases.split(",")
    if unknown := [case for case in cases if case not in every]:
        parser.error(f"unknown case(s) {', '.join(map(repr, unknown))}; known: {', '.join(every)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if args.quick:
        args.runs, args.seconds, args.replay_seconds = 1, 0.3, 0.2
        args.fill, args.warmup, args.profile_steps = min(args.fill, 5_000), 3, 5
    if args.threads:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    learner_rows, replay_rows = [], []
    for case in cases:
        began = time.perf_counter()
        rows = [learner_case(case, args, sync)] if case in LEARNER_CASES else replay_case(case, args, sync)
        (learner_rows if case in LEARNER_CASES else replay_rows).extend(rows)
        print(f"{case}: {time.perf_counter() - began:.0f} s, ours ran {', '.join(r['step'] for r in rows)}",
              flush=True)
        gc.collect()
    print_tables(learner_rows, replay_rows, args.device)
    failures = [(r["case"] + (f" {r['operation']}" if "operation" in r else ""), r["capture_error"])
                for r in learner_rows + replay_rows if r["capture"] and r["step"] != "captured"]
    if args.json:
        meta = {"device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads(),
                "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
                "runs": args.runs, "seconds": args.seconds, "fill": args.fill, "read_every": READ_EVERY,
                "capture": args.capture, "capture_failures": [{"case": c, "reason": why} for c, why in failures]}
        with open(args.json, "w") as f:
            json.dump({**meta, "learner": learner_rows, "replay": replay_rows}, f, indent=1)
    for case, why in failures:
        print(f"FAILED: {case} was to run captured (--capture {args.capture}) but ran eagerly: {why}",
              file=sys.stderr, flush=True)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
