"""Two commits of the package in one process, taking turns on the same recordings.

`versus.py` runs a benchmark script against each package in turn, one process after the other,
and the machine's speed drifts between them: on a shared 2-core host the same loop moved by 20%
between two runs. Here both packages are imported side by side (``BASE``'s exported with
``git archive`` and renamed ``fe_base``), each recording loop is made once per package, and every
round runs a short stretch of each, in a random order, on the same actions. Printed per loop: each
package's median time and the median of the rounds' own ratios (this checkout / BASE), with the
lowest and highest. A ratio within a few percent of 1.00 is no change.

Loops: CartPole-v1 (`fe.record`), gymnasium's native vector CartPole x64, PettingZoo's
connect_four_v3 (AEC, action masks), and SB3's add + sample(64) on our `ReplayBuffer`.

Run: python benchmarks/ab.py BASE [--rounds 40]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
from stamp import commit, machine  # beside this script
from versus import export

#: a loop made for one package: runs one stretch, returns its seconds
Stretch = Callable[[], float]


def renamed(base: str, into: Path) -> tuple[str, ModuleType]:
    """``base``'s package exported under ``into`` as ``fe_base``, imported; and its short commit."""
    sha = export(base, into / "export")
    source, target = into / "export" / "flexibuff_envs", into / "fe_base"
    for path in source.rglob("*"):
        out = target / path.relative_to(source)
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            data = path.read_bytes()
            out.write_bytes(data.replace(b"flexibuff_envs", b"fe_base") if path.suffix == ".py" else data)
    sys.path.insert(0, str(into))
    return sha, importlib.import_module("fe_base")


def cartpole(fe: ModuleType, steps: int) -> Stretch:
    env = fe.record(gym.make("CartPole-v1"), num_steps=1_000_000)
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, steps).tolist()

    def stretch() -> float:
        start = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        return time.perf_counter() - start

    return stretch


def vector(fe: ModuleType, steps: int) -> Stretch:
    env = fe.record(
        gym.make_vec("CartPole-v1", num_envs=64, vectorization_mode="vector_entry_point"), num_steps=200_000
    )
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, (max(1, steps // 8), 64))  # a stretch as long as the others

    def stretch() -> float:
        start = time.perf_counter()
        for action in actions:
            env.step(action)
        return time.perf_counter() - start

    return stretch


def connect_four(fe: ModuleType, steps: int) -> Stretch:
    from pettingzoo.classic import connect_four_v3

    env = fe.record(connect_four_v3.env(), num_steps=200_000)
    rng = np.random.default_rng(0)

    def stretch() -> float:
        start, done = time.perf_counter(), 0
        while done < steps // 10:
            env.reset(seed=0)
            for _ in env.agent_iter():
                obs, _, terminated, truncated, _ = env.last()
                legal = np.flatnonzero(obs["action_mask"])
                env.step(None if terminated or truncated else int(legal[rng.integers(len(legal))]))
                done += 1
        return time.perf_counter() - start

    return stretch


def sb3_cycle(fe: ModuleType, steps: int) -> Stretch:
    replay = importlib.import_module(f"{fe.__name__}.integrations.sb3").ReplayBuffer
    space = gym.make("CartPole-v1")
    buffer = replay(40_000, space.observation_space, space.action_space, device="cpu")
    rng = np.random.default_rng(0)
    obs = rng.random((1, 4), dtype=np.float32)
    step: tuple[Any, ...] = (np.ones(1, dtype=np.int64), np.ones(1), np.zeros(1, dtype=bool), [{}])
    for _ in range(5_000):
        buffer.add(obs, obs, *step)

    def stretch() -> float:
        start = time.perf_counter()
        for _ in range(steps // 20):
            buffer.add(obs, obs, *step)
            buffer.sample(64)
        return time.perf_counter() - start

    return stretch


LOOPS: dict[str, Callable[[ModuleType, int], Stretch]] = {
    "CartPole-v1, fe.record": cartpole,
    "native vector CartPole x64": vector,
    "connect_four_v3 (AEC)": connect_four,
    "SB3 ReplayBuffer add + sample(64)": sb3_cycle,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=2_000, help="env steps per stretch (fewer for the slower loops)")
    args = parser.parse_args()
    import flexibuff_envs as this

    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory() as directory:
        sha, base = renamed(args.base, Path(directory))
        print(f"benchmarks/ab.py: this checkout ({commit()}) against {sha}, in one process, {args.rounds} rounds")
        print(f"{started:%Y-%m-%d %H:%M} UTC, on {machine()}")
        order = random.Random(0)
        for name, make in LOOPS.items():
            runs = {"base": make(base, args.steps), "this": make(this, args.steps)}
            times: dict[str, list[float]] = {"base": [], "this": []}
            for _ in range(args.rounds):
                for label in order.sample(sorted(runs), 2):
                    times[label].append(runs[label]())
            ratios = sorted(new / old for new, old in zip(times["this"], times["base"]))
            print(
                f"  {name:<36} base {statistics.median(times['base']) * 1e3:8.2f} ms   "
                f"this {statistics.median(times['this']) * 1e3:8.2f} ms   "
                f"this/base {statistics.median(ratios):.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
