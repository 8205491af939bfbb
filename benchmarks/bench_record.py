"""Recording overhead: CartPole-v1 through the recorder vs the bare env and vs each peer, same actions.

The peers record the way their users do: step the bare env, then call their buffer's ``add``
(flexibuff 0.3.1, SB3, Tianshou, TorchRL; `peers.py`). Prints the median of several interleaved
rounds, in microseconds per step, and the ratios to the bare loop.
Run: python benchmarks/bench_record.py [--steps N] [--rounds R]   (peers: pip install -e '.[bench]')
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import PEERS, Add, installed

SKIP = ("SB3 optimize_memory_usage", "Tianshou ignore_obs_next")  # same add path as their defaults


def run(env: gym.Env, actions: np.ndarray) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return (time.perf_counter() - start) / len(actions) * 1e6


def run_peer(env: gym.Env, add: Add, actions: np.ndarray) -> float:
    obs, _ = env.reset(seed=0)
    start = time.perf_counter()
    for action in actions:
        obs_, reward, terminated, truncated, _ = env.step(action)
        add(obs, action, float(reward), obs_, terminated, truncated)
        obs = env.reset()[0] if terminated or truncated else obs_
    return (time.perf_counter() - start) / len(actions) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    actions = np.random.default_rng(0).integers(0, 2, args.steps).tolist()
    bare = gym.make("CartPole-v1")
    recorded = fe.record(gym.make("CartPole-v1"), num_steps=args.steps)
    peers = {name: make(bare.observation_space, args.steps)[0] for name, make in PEERS.items()
             if installed(name) and name not in SKIP}
    timings: dict[str, list[float]] = {"bare": [], "recorded": [], **{name: [] for name in peers}}
    for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits all alike
        timings["bare"].append(run(bare, actions))
        timings["recorded"].append(run(recorded, actions))
        for name, add in peers.items():
            timings[name].append(run_peer(bare, add, actions))
    us = {name: statistics.median(t) for name, t in timings.items()}
    print(f"CartPole-v1, {args.steps} steps x {args.rounds} rounds (median us/step; ratio to the bare loop)")
    print(f"  {'bare env step':<38} {us['bare']:7.2f} us")
    print(f"  {'flexibuff_envs (fe.record)':<38} {us['recorded']:7.2f} us  {us['recorded'] / us['bare']:5.2f}x"
          "  (target <= 1.40x)")
    for name in peers:
        print(f"  {name + ' (step + add)':<38} {us[name]:7.2f} us  {us[name] / us['bare']:5.2f}x")

if __name__ == "__main__":
    main()
