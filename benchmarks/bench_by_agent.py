"""A batch keyed by agent (`FlexiBatch.by_agent`, AgileRL's layout) against the batch itself.

mpe2's simple_spread (3 agents, a global state) is recorded for ``--steps`` steps with random
moves; then, in ``--rounds`` rounds of ``--draws`` draws each (numpy and torch interleaved), each
``sample_transitions(256)`` and the ``by_agent()`` of its batch are timed apart. Prints their
medians and what a keyed batch costs against the batch alone (the goal: at most 1.10x), with the
machine, date and commit.
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
from flexibuff_envs.batch import FlexiBatch


def timed(draw: Callable[[], FlexiBatch], draws: int) -> tuple[float, float]:
    """Microseconds per draw: of the draw, and of keying its batch by agent right after."""
    sampled = keyed = 0.0
    for _ in range(draws):
        start = time.perf_counter()
        batch = draw()
        middle = time.perf_counter()
        batch.by_agent()
        keyed += time.perf_counter() - middle
        sampled += middle - start
    return sampled / draws * 1e6, keyed / draws * 1e6


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
        "numpy": lambda: buffer.sample_transitions(256),
        "torch": lambda: buffer.sample_transitions(256, as_torch=True),
    }
    times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in cases}
    for _ in range(args.rounds):
        for kind, draw in cases.items():
            times[kind].append(timed(draw, args.draws))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    print(
        f"by_agent: {platform.node()} ({os.cpu_count()} cores, {platform.python_version()}), "
        f"{datetime.date.today()}, commit {commit}; simple_spread x3 agents, {len(buffer):,} rows, batches of 256, "
        f"medians of {args.rounds} rounds of {args.draws} draws"
    )
    for kind, rounds in times.items():
        batch = statistics.median(t for t, _ in rounds)
        keyed = statistics.median(k for _, k in rounds)
        print(
            f"  {kind}: sample_transitions {batch:7.1f} us, by_agent() of its batch {keyed:5.1f} us: "
            f"{(batch + keyed) / batch:5.3f}x the batch alone (goal <= 1.10x)"
        )


if __name__ == "__main__":
    main()
