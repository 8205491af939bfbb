"""Compressed buffer files against raw ones, side by side in one run: Atari frames recorded from a
real env (ALE Pong with random actions: raw 210x160x3 frames, and ``AtariPreprocessing`` with a
4-frame stack when opencv is installed), each buffer saved with ``compress="auto"`` (zstd) and
with ``compress=None``, then loaded. Prints the bytes a step each file takes, the ratio, and the
median save and load times over the rounds (the page cache warm, as after a save); every loaded
buffer is checked equal to the recorded one, episode by episode.

Run: python benchmarks/bench_compress.py [--steps 2500] [--rounds 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe


def recorded(make: Callable[[], Any], steps: int, seed: int) -> fe.FlexibleBuffer:
    env = fe.record(make(), num_steps=steps + 1)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(steps):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    return env.buffer


def envs() -> dict[str, Callable[[], Any]]:
    import ale_py

    gym.register_envs(ale_py)
    out: dict[str, Callable[[], Any]] = {"Pong raw frames (210x160x3)": lambda: gym.make("ALE/Pong-v5")}
    try:
        import cv2  # noqa: F401 - AtariPreprocessing's
    except ImportError:
        return out
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    out["Pong, AtariPreprocessing, stack of 4"] = lambda: FrameStackObservation(
        AtariPreprocessing(gym.make("ALE/Pong-v5", frameskip=1)), 4
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.steps:,} random steps a recording, seed {args.seed}; medians of {args.rounds} rounds")
    print(f"  {'recording':<38} {'file':>6} {'bytes a step':>13} {'ratio':>7} {'save':>8} {'load':>8}")
    with tempfile.TemporaryDirectory() as root:
        for name, make in envs().items():
            buffer = recorded(make, args.steps, args.seed)
            want = list(buffer.episodes())
            sizes: dict[str, int] = {}
            for label, compress in (("raw", None), ("zstd", "auto")):
                saves, loads = [], []
                path = os.path.join(root, f"{label}.fbuf")
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    buffer.save(path, compress=compress)
                    saves.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    loaded = fe.FlexibleBuffer.load(path)
                    loads.append(time.perf_counter() - start)
                got = list(loaded.episodes())
                if len(got) != len(want) or any(not np.array_equal(a.obs, b.obs) for a, b in zip(got, want)):
                    raise SystemExit(f"{name}, {label}: the loaded buffer differs from the recorded one")
                sizes[label] = os.path.getsize(path)
                ratio = sizes["raw"] / sizes[label]
                print(
                    f"  {name if label == 'raw' else '':<38} {label:>6} {sizes[label] / len(buffer):>13,.0f} "
                    f"{ratio:>6,.0f}x {statistics.median(saves):>7.3f}s {statistics.median(loads):>7.3f}s"
                )


if __name__ == "__main__":
    main()
