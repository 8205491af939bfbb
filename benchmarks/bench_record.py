"""Recording overhead: CartPole-v1 through the recorder vs the bare env, same actions, one run.

Prints the median of several interleaved rounds, in microseconds per step, and the ratio.
Run: python benchmarks/bench_record.py [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe


def run(env: gym.Env, actions: np.ndarray) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return (time.perf_counter() - start) / len(actions) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    actions = np.random.default_rng(0).integers(0, 2, args.steps).tolist()
    bare = gym.make("CartPole-v1")
    recorded = fe.record(gym.make("CartPole-v1"), num_steps=args.steps)
    timings: dict[str, list[float]] = {"bare": [], "recorded": []}
    for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits both alike
        timings["bare"].append(run(bare, actions))
        timings["recorded"].append(run(recorded, actions))
    bare_us = statistics.median(timings["bare"])
    rec_us = statistics.median(timings["recorded"])
    print(f"CartPole-v1, {args.steps} steps x {args.rounds} rounds (median)")
    print(f"  bare env step       {bare_us:7.2f} us/step")
    print(f"  recorded env step   {rec_us:7.2f} us/step")
    print(f"  ratio recorded/bare {rec_us / bare_us:7.2f}x  (target <= 1.40x)")


if __name__ == "__main__":
    main()
