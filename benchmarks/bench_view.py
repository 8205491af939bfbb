"""The episode browser on large logs: how long a log takes to open, what each request costs, and
the memory it holds, as the log grows in episodes and in bytes.

1. Episodes: a CartPole x64 log (native vector env, random actions, seed 0) of ``--rows`` rows,
   merged with itself into logs of about 10x and 100x as many episodes (``--episodes``, 1 million
   by default). For each: `Run` open (the table of every episode included), the polled summary,
   the runs' curves, a sorted page of the table, one episode's timeline and one frame, each a
   median of ``--rounds``; the memory the opened run holds (traced allocations: the log's pages
   it read are the OS's page cache, not counted).
2. Bytes: a log of raw (uncompressed) 84x84x4 frames of ``--gb`` GB, made the same way (one
   recorded log merged with itself), opened and served as above: what opening costs beside its size.

Prints the machine, date, commit and the medians. Run: python benchmarks/bench_view.py
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from bench_log_read import record as cartpole  # beside this script: CartPole x64, random actions
from stamp import commit, machine

import flexibuff_envs as fe
from flexibuff_envs.view.data import Run


class Frames(gym.Env):  # type: ignore[type-arg]
    """84x84x4 bytes a step, random (they do not compress), episodes of 100 steps."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (84, 84, 4), np.uint8), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self.np_random.integers(0, 256, (84, 84, 4), np.uint8), 1.0, False, self.t == 100, {}


def frames(directory: Path, steps: int) -> None:
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(Frames()), num_steps=1000)
    buffer.log_to(directory, compress=None)
    env = fe.record(Frames(), buffer)
    env.reset(seed=0)
    for _ in range(steps):
        if any(env.step(0)[2:4]):
            env.reset()
    env.close()
    buffer.close_log()


def median(call: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def measure(directory: Path, rounds: int) -> str:
    """One line: the log's size, episodes, and the medians of opening it and of each request."""
    opened = median(lambda: Run(str(directory)), rounds)
    gc.collect()
    tracemalloc.start()
    run = Run(str(directory))
    held = tracemalloc.get_traced_memory()[0] / 2**20  # its arrays; the log's pages it read are page cache
    tracemalloc.stop()
    n = len(run.table.lengths)
    costs = {
        "summary": median(run.summary, rounds),
        "curves": median(lambda: run.curves(smooth=100), rounds),
        "page": median(lambda: run.episodes(sort="return", descending=True), rounds),
        "episode": median(lambda: run.episode(n // 2), rounds),
        "frame": median(lambda: run.frame(n // 2, 0, 0), rounds),
    }
    requests = ", ".join(f"{name} {1000 * t:.1f} ms" for name, t in costs.items())
    return (
        f"{size(directory) / 1e9:7.2f} GB {n:>10,} episodes: open {opened:.2f} s; {requests}; "
        f"memory it holds {held:,.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=250_000, help="rows of the first CartPole log")
    parser.add_argument("--episodes", type=int, default=1_000_000, help="episodes of the largest CartPole log")
    parser.add_argument("--gb", type=float, default=10.0, help="bytes of the frames log")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the logs go (default: a temporary directory)")
    args = parser.parse_args()
    print(f"flexibuff-envs view on large logs: {machine()}, commit {commit()}, seed 0, medians of {args.rounds}")
    root = Path(args.dir or tempfile.mkdtemp(prefix="flexibuff-bench-view-"))
    try:
        cartpole(root / "cartpole-1", args.rows)
        first = len(Run(str(root / "cartpole-1")).table.lengths)
        print(measure(root / "cartpole-1", args.rounds))
        copies = max(1, round(args.episodes / first))
        for k in sorted({max(1, copies // 10), copies} - {1}):
            fe.merge_logs([root / "cartpole-1"] * k, root / f"cartpole-{k}")
            print(measure(root / f"cartpole-{k}", args.rounds))
            shutil.rmtree(root / f"cartpole-{k}")
        step = 84 * 84 * 4  # an observation (its next one: the next row's)
        steps = min(int(args.gb * 1e9 / step), 20_000)
        frames(root / "frames-1", steps)
        print(measure(root / "frames-1", args.rounds))
        copies = max(1, round(args.gb * 1e9 / size(root / "frames-1")))
        if copies > 1:
            fe.merge_logs([root / "frames-1"] * copies, root / "frames-many")
            print(measure(root / "frames-many", args.rounds))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
