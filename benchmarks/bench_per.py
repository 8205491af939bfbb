"""Prioritized replay at 1,000,000 rows: one sample(256) + update_priorities(256) cycle.

Side by side in one run: our sum/min trees (`sample_transitions(prioritized=True)` then
`update_priorities`), our FlexiBuff-style `memory_weights` draw (`weighted=True`, a pass over
every live row per batch) then `set_memory_weights`. Medians of interleaved rounds, in
microseconds. (The peers the issue names, Tianshou, cpprb and TorchRL, are not measured here yet.)
Run: python benchmarks/bench_per.py [--rows 1000000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import flexibuff_envs as fe

Cycle = Callable[[], tuple[float, float]]


def ours(rows: int, prioritized: bool) -> Cycle:
    buffer = fe.FlexibleBuffer(rows, 4, [2], seed=0, memory_weights=not prioritized)
    for _ in range(rows // 1000):  # episodes of 1,000 rows, claimed without stepping an env
        buffer.begin_episode()
        for _ in range(1000):
            buffer.claim_row()
        buffer.end_episode()
    rng = np.random.default_rng(0)

    def cycle() -> tuple[float, float]:
        start = time.perf_counter()
        batch = buffer.sample_transitions(256, prioritized=prioritized, weighted=not prioritized,
                                          fields=("obs",))
        drawn = time.perf_counter()
        if prioritized:
            buffer.update_priorities(batch.idx, rng.random(256) + 1e-6)
        else:
            buffer.set_memory_weights(batch.idx, rng.random(256) + 1e-6)
        return drawn - start, time.perf_counter() - drawn

    return cycle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cycles = {"flexibuff_envs prioritized (trees)": ours(args.rows, True),
              "flexibuff_envs memory_weights (a pass per batch)": ours(args.rows, False)}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cycles}
    for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits all alike
        for name, cycle in cycles.items():
            times[name] += [cycle() for _ in range(20)]
    print(f"sample(256) + update(256) at {args.rows:,} rows, {args.rounds} rounds (median us)")
    floor = None
    for name, runs in times.items():
        draw = statistics.median(t[0] for t in runs) * 1e6
        update = statistics.median(t[1] for t in runs) * 1e6
        floor = floor or draw + update
        print(f"  {name:<50} sample {draw:8.1f}  update {update:8.1f}  total {draw + update:8.1f}  "
              f"{(draw + update) / floor:5.2f}x")


if __name__ == "__main__":
    main()
