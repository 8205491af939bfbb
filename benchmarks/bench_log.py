"""What streaming every ended episode to an episode log costs, against the same loop in RAM only.

Side by side in one run, interleaved rounds, the same actions: CartPole-v1 recorded by
`fe.record` with and without ``log=DIR`` (default fsync policy: every 5 s), with random actions
(22-step episodes) and with a policy that balances the pole (longer episodes), gymnasium's natively
vectorized CartPole x64 (each ended episode logged in the step it ends, and with
``per_block=True``: with the recorder's blocks of steps), and PettingZoo's connect_four_v3 (AEC). Prints medians in microseconds
per env step (per sub-env step for the vector env, per turn for AEC), the ratio, and what the log adds to each
ended episode (the difference times the steps per episode).
Run: python benchmarks/bench_log.py [--steps N] [--rounds R] [--only NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import (  # the recorded loops (its peers are imported there: torch too)
    run,
    run_aec,
)

#: a case's microseconds per step and the episodes that ended in it
Measured = tuple[float, int]


def cartpole(log: str | None, steps: int) -> Measured:
    env = fe.record(gym.make("CartPole-v1"), num_steps=steps, log=log)
    us = run(env, np.random.default_rng(0).integers(0, 2, steps).tolist())
    env.close()
    return us, env.buffer.n_episodes


def balanced(log: str | None, steps: int) -> Measured:
    """CartPole with a policy that balances the pole (episodes of about 200-500 steps): what an
    episode's append costs spread over a longer episode."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=steps, log=log)
    obs, _ = env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(int(obs[2] + 0.5 * obs[3] > 0))
        if terminated or truncated:
            obs, _ = env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed / steps * 1e6, env.buffer.n_episodes


def vector(log: str | None, steps: int, n: int = 64, per_block: bool = False) -> Measured:
    venv = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(venv), num_steps=steps // n + 1)
    if log is not None:
        buffer.log_to(log, per_block=per_block)
    env = fe.record(venv, buffer)
    actions = np.random.default_rng(0).integers(0, 2, (steps // n, n))
    env.reset(seed=0)
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    len(env.buffer)  # the last block written, as any read does
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed / (len(actions) * n) * 1e6, env.buffer.n_episodes


def connect_four(log: str | None, steps: int) -> Measured:
    from pettingzoo.classic import connect_four_v3

    env = fe.record(connect_four_v3.env(), num_steps=steps, log=log)
    us = run_aec(env, np.random.default_rng(0).random(steps))
    env.close()
    return us, env.buffer.n_episodes


def compare(name: str, run: Callable[[str | None, int], Measured], steps: int, rounds: int) -> None:
    ram: list[float] = []
    logged: list[float] = []
    for _ in range(rounds):
        ram.append(run(None, steps)[0])
        with tempfile.TemporaryDirectory() as directory:
            us, episodes = run(directory, steps)
            logged.append(us)
    a, b = statistics.median(ram), statistics.median(logged)
    per_episode = (b - a) * steps / max(episodes, 1)  # what the log adds to each ended episode
    print(
        f"  {name:<40} RAM only {a:8.2f} us   with log {b:8.2f} us   {b / a:5.2f}x  (target <= 1.10x)"
        f"   {steps / max(episodes, 1):6.1f} steps/episode, the log adds {per_episode:6.0f} us an episode"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = parser.parse_args()
    print(f"recording with an episode log against RAM only, {args.steps} steps x {args.rounds} rounds (medians)")
    cases: list[tuple[str, Callable[[Any, int], Measured], int]] = [
        ("CartPole-v1", cartpole, args.steps),
        ("CartPole-v1, a balancing policy", balanced, args.steps),
        ("CartPole-v1 x64, native vector", vector, args.steps * 8),
        ("  the same, log_to(per_block=True)", lambda log, steps: vector(log, steps, per_block=True), args.steps * 8),
        ("connect_four_v3 (AEC)", connect_four, args.steps // 5),
    ]
    for name, measure, steps in cases:
        if args.only in name:
            compare(name, measure, steps, args.rounds)


if __name__ == "__main__":
    main()
