"""GAE(lambda) plus returns over a 100,000-step rollout of about 2,000 episodes.

Side by side in one run: flexibuff_envs.returns.gae writing into preallocated arrays (as a buffer
does), the same allocating its results, and a plain Python loop (what SB3's buffer does). Medians.
Run: python benchmarks/bench_gae.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from flexibuff_envs.returns import gae

T, EPISODES, GAMMA, LAM = 100_000, 2_000, 0.99, 0.95


def rollout() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 90, EPISODES)
    lengths = (lengths * T / lengths.sum()).astype(int)
    lengths[-1] += T - lengths.sum()
    ends = np.zeros(T, dtype=bool)
    ends[np.cumsum(lengths) - 1] = True
    rewards, values = rng.normal(size=T).astype(np.float32), rng.normal(size=T).astype(np.float32)
    bootstrap = np.where(rng.random(T) < 0.5, rng.normal(size=T), 0.0).astype(np.float32)
    return rewards, values, ends, bootstrap


def plain_loop(rewards: np.ndarray, values: np.ndarray, ends: np.ndarray, bootstrap: np.ndarray) -> np.ndarray:
    advantages = np.zeros(T, dtype=np.float32)
    acc = 0.0
    for t in range(T - 1, -1, -1):
        following = bootstrap[t] if ends[t] else values[t + 1]
        acc = rewards[t] + GAMMA * following - values[t] + (0.0 if ends[t] else GAMMA * LAM * acc)
        advantages[t] = acc
    return advantages


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    rewards, values, ends, bootstrap = rollout()
    out = (np.empty(T, dtype=np.float32), np.empty(T, dtype=np.float32))
    reference = plain_loop(rewards, values, ends, bootstrap)
    gae(rewards, values, ends, GAMMA, LAM, bootstrap, out=out)
    np.testing.assert_allclose(out[0], reference, rtol=1e-4, atol=1e-4)
    into = median_ms(lambda: gae(rewards, values, ends, GAMMA, LAM, bootstrap, out=out), 101)
    allocating = median_ms(lambda: gae(rewards, values, ends, GAMMA, LAM, bootstrap), 101)
    loop = median_ms(lambda: plain_loop(rewards, values, ends, bootstrap), 3)
    print(f"GAE + returns, {T} steps, {int(ends.sum())} episodes (median)")
    print(f"  gae(..., out=buffers)   {into:8.3f} ms  (target <= 1 ms)")
    print(f"  gae(...) allocating     {allocating:8.3f} ms")
    print(f"  plain Python loop       {loop:8.1f} ms  ({loop / into:,.0f}x slower)")


if __name__ == "__main__":
    main()
