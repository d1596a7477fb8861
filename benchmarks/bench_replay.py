"""PrioritizedReplay against cpprb's PrioritizedReplayBuffer, side by side in one run.

One operation = sample(B) with IS weights and the data gather + update_priorities(B).
Both buffers hold the same fields with the same alpha/beta; runs alternate between them
so machine noise hits both alike. Reports medians of ``--runs`` runs and the ratio.

    python benchmarks/bench_replay.py                 # every case, CPU
    python benchmarks/bench_replay.py --device cuda   # our buffer on the GPU (cpprb stays on CPU)
    python benchmarks/bench_replay.py --compile-times # the CPU kernels' first use: cold, then cached
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from actorlearner.lifeline import tied_to_this_process
from actorlearner.replay import make_replay

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
CASES = {  # name -> (capacity, observation shape, observation dtype)
    "vector-1M": (1_000_000, (4,), np.float32),
    "atari-100k": (100_000, (84, 84, 4), np.uint8),
}


def make_fields(obs_shape, obs_dtype) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {"obs": (obs_shape, obs_dtype), "action": ((), np.int64), "reward": ((), np.float32),
            "discount": ((), np.float32), "next_obs": (obs_shape, obs_dtype)}


def random_batch(fields, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, (shape, dtype) in fields.items():
        if np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 255, size=(n, *shape), dtype=dtype)
        else:
            out[name] = rng.random((n, *shape), dtype=np.float32).astype(dtype)
    return out


class Ours:
    name = "actorlearner"

    def __init__(self, capacity, fields, device, branching):
        torch_fields = {k: (s, torch.from_numpy(np.empty(0, d)).dtype) for k, (s, d) in fields.items()}
        self.buffer = make_replay(capacity, torch_fields, alpha=ALPHA, beta=BETA, eps=EPS, device=device,
                                        branching=branching)
        self.device = torch.device(device)

    def add(self, batch):
        self.buffer.add(batch)

    def op(self, batch_size, priorities):
        sample = self.buffer.sample(batch_size)
        self.buffer.update_priorities(sample.indices, priorities)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()


class Cpprb:
    name = "cpprb"

    def __init__(self, capacity, fields):
        import cpprb

        env_dict = {k: {"shape": s or 1, "dtype": d} for k, (s, d) in fields.items()}
        self.buffer = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=ALPHA, eps=EPS)

    def add(self, batch):
        self.buffer.add(**batch)

    def op(self, batch_size, priorities):
        sample = self.buffer.sample(batch_size, beta=BETA)
        self.buffer.update_priorities(sample["indexes"], priorities)

    def sync(self):
        pass


def rate(fn, min_seconds: float, sync) -> float:
    """Calls per second of ``fn`` over at least ``min_seconds`` (after one warm-up call)."""
    fn()
    sync()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_seconds or calls < 3:
        fn()
        sync()
        calls += 1
        elapsed = time.perf_counter() - start
    return calls / elapsed


def run_case(case, batch_sizes, runs, seconds, device, add_chunk, branching):
    capacity, obs_shape, obs_dtype = CASES[case]
    fields = make_fields(obs_shape, obs_dtype)
    rng = np.random.default_rng(0)
    fill_chunk = random_batch(fields, min(10_000, capacity), rng)
    add_batch = random_batch(fields, add_chunk, rng)
    buffers = [Ours(capacity, fields, device, branching), Cpprb(capacity, fields)]
    for buf in buffers:
        for _ in range(0, capacity, len(fill_chunk["obs"])):
            buf.add(fill_chunk)
    rows = []
    for batch_size in batch_sizes:
        priorities = rng.random(batch_size) + 0.01
        results = {buf.name: [] for buf in buffers}
        for _ in range(runs):
            for buf in buffers:
                results[buf.name].append(rate(lambda: buf.op(batch_size, priorities), seconds, buf.sync))
        rows.append(summarize(case, f"sample+update B={batch_size}", "ops/s", results))
    results = {buf.name: [] for buf in buffers}
    for _ in range(runs):
        for buf in buffers:
            results[buf.name].append(add_chunk * rate(lambda: buf.add(add_batch), seconds, buf.sync))
    rows.append(summarize(case, f"add {add_chunk}-item batches", "items/s", results))
    del buffers
    gc.collect()
    return rows


FIRST_USE = """
import time, numpy as np, torch
from actorlearner.replay import make_replay
buf = make_replay(1000, {"obs": ((4,), torch.float32), "action": ((), torch.int64)})
began = time.perf_counter()
buf.add({"obs": np.ones((300, 4), np.float32), "action": np.arange(300)})
sample = buf.sample(32)
buf.update_priorities(sample.indices, np.ones(32))
print(time.perf_counter() - began)
"""


def compile_times(runs: int) -> dict[str, float]:
    """Seconds of a new process's first add + sample + update: with an empty kernel cache (numba
    compiles), then with the cache that run left (numba loads). Medians of ``runs`` pairs."""
    cold, cached = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}
            for out in (cold, cached):
                result = subprocess.run([sys.executable, "-c", FIRST_USE], env=env, capture_output=True, text=True,
                                        check=True, preexec_fn=tied_to_this_process())
                out.append(float(result.stdout.split()[-1]))
    return {"cold_s": statistics.median(cold), "cached_s": statistics.median(cached), "runs": runs}


def summarize(case, operation, unit, results):
    ours, theirs = statistics.median(results["actorlearner"]), statistics.median(results["cpprb"])
    return {"case": case, "operation": operation, "unit": unit, "ours": ours, "cpprb": theirs,
            "ratio": ours / theirs, "runs": len(results["cpprb"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--batch-sizes", default="256,4096")
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement; the median is reported")
    parser.add_argument("--seconds", type=float, default=1.0, help="minimum time per run")
    parser.add_argument("--add-chunk", type=int, default=256, help="items per add() call")
    parser.add_argument("--device", default="cpu", help="device of our buffer (cpprb is CPU only)")
    parser.add_argument("--branching", type=int, default=16, help="our sum tree's fan-out K")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (cpprb uses one; 0 keeps torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--compile-times", action="store_true",
                        help="only time the CPU kernels' first use in new processes, cold and cached")
    args = parser.parse_args()
    if args.compile_times:
        times = compile_times(args.runs)
        print(f"first add+sample+update: {times['cold_s']:.2f} s cold (compiling), {times['cached_s']:.2f} s cached")
        if args.json:
            print(json.dumps(times))
        return
    if args.threads:
        torch.set_num_threads(args.threads)

    rows = []
    for case in args.cases.split(","):
        rows += run_case(case, [int(b) for b in args.batch_sizes.split(",")], args.runs, args.seconds,
                         args.device, args.add_chunk, args.branching)
    print(f"| case | operation | actorlearner ({args.device}) | cpprb (cpu) | ratio |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['operation']} | {r['ours']:,.0f} {r['unit']} | {r['cpprb']:,.0f} {r['unit']} | {r['ratio']:.2f}x |")
    if args.json:
        print(json.dumps({"device": args.device, "branching": args.branching,
                          "torch_threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
