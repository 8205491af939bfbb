"""A batch keyed by agent (`FlexiBatch.by_agent`, AgileRL's layout) against the batch itself.

mpe2's simple_spread (3 agents, a global state) is recorded for ``--steps`` steps with random
moves; then, interleaved in ``--rounds`` rounds of ``--draws`` draws each, ``sample_transitions(256)``
alone and followed by ``by_agent()``, numpy and torch. Prints medians and their ratio (the goal:
at most 1.10x), with the machine, date and commit.
Run: python benchmarks/bench_by_agent.py [--steps 20000] [--rounds 15] [--draws 200]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpe2 import simple_spread_v3

import flexibuff_envs as fe


def timed(draw: Callable[[], object], draws: int) -> float:
    start = time.perf_counter()
    for _ in range(draws):
        draw()
    return (time.perf_counter() - start) / draws * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args()
    env = fe.record(simple_spread_v3.parallel_env(max_cycles=25), num_steps=args.steps, seed=0)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(args.steps):
        env.step({agent: int(rng.integers(5)) for agent in env.agents})
        if not env.agents:
            env.reset()
    buffer = env.buffer
    cases = {
        "numpy": (lambda: buffer.sample_transitions(256), lambda: buffer.sample_transitions(256).by_agent()),
        "torch": (
            lambda: buffer.sample_transitions(256, as_torch=True),
            lambda: buffer.sample_transitions(256, as_torch=True).by_agent(),
        ),
    }
    times: dict[str, list[float]] = {f"{kind} {which}": [] for kind in cases for which in ("batch", "by_agent")}
    for _ in range(args.rounds):
        for kind, (batch, keyed) in cases.items():
            times[f"{kind} batch"].append(timed(batch, args.draws))
            times[f"{kind} by_agent"].append(timed(keyed, args.draws))
    med = {key: statistics.median(value) for key, value in times.items()}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    print(
        f"by_agent: {platform.node()} ({os.cpu_count()} cores, {platform.python_version()}), "
        f"{datetime.date.today()}, commit {commit}; simple_spread x3 agents, {len(buffer):,} rows, batches of 256, "
        f"medians of {args.rounds} rounds of {args.draws} draws"
    )
    for kind in cases:
        batch, keyed = med[f"{kind} batch"], med[f"{kind} by_agent"]
        print(
            f"  {kind}: sample_transitions {batch:7.1f} us, + by_agent() {keyed:7.1f} us, {keyed / batch:5.3f}x "
            "(goal <= 1.10x)"
        )


if __name__ == "__main__":
    main()
