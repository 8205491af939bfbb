"""Sampling cost: sample_transitions(256, as_torch=True) from a 1,000,000-row buffer vs the floor.

The floor is a bare numpy gather of the same fields from plain arrays (uniform indices, torch
tensors of the same dtypes out), timed side by side in one run. Prints medians and the ratio.
Run: python benchmarks/bench_sample.py [--rows N] [--batch B]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

import flexibuff_envs as fe


def filled_buffer(rows: int) -> fe.FlexibleBuffer:
    """A CartPole-layout buffer with ``rows`` rows of random data in 200-step episodes."""
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(gym.make("CartPole-v1")), num_steps=rows)
    rng = np.random.default_rng(0)
    for name in ("obs", "obs_", "individual_rewards", "global_rewards"):
        array = buffer.field(name)
        array[...] = rng.normal(size=array.shape)
    buffer.field("discrete_actions")[...] = rng.integers(0, 2, buffer.field("discrete_actions").shape)
    buffer.field("active")[...] = True
    for _ in range(rows // 200):
        buffer.begin_episode()
        for _ in range(200):
            buffer.claim_row()
        buffer.end_episode()
    return buffer


def time_it(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(100):
            fn()
        samples.append((time.perf_counter() - start) / 100 * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    buffer = filled_buffer(args.rows)
    arrays = {name: array[0] if array.ndim > 1 and array.shape[0] == 1 and name != "global_rewards" else array
              for name, array in buffer._storage}
    rng = np.random.default_rng(1)

    def floor() -> dict[str, torch.Tensor]:
        idx = rng.integers(0, args.rows, args.batch)
        out = {}
        for name, array in arrays.items():
            tensor = torch.from_numpy(array.take(idx, axis=0))
            out[name] = tensor if tensor.dtype in (torch.float32, torch.int64) else tensor.float()
        return out

    def ours() -> fe.FlexiBatch:
        return buffer.sample_transitions(args.batch, as_torch=True)

    floor_us, ours_us = [], []
    for _ in range(5):  # interleave so machine noise hits both alike
        floor_us.append(time_it(floor, args.repeats))
        ours_us.append(time_it(ours, args.repeats))
    f, o = statistics.median(floor_us), statistics.median(ours_us)
    print(f"sample_transitions({args.batch}, as_torch=True) from {args.rows} rows, "
          f"fields {sorted(arrays)} (median)")
    print(f"  bare numpy gather + torch  {f:7.1f} us/batch")
    print(f"  FlexibleBuffer             {o:7.1f} us/batch")
    print(f"  ratio buffer/floor         {o / f:7.2f}x  (target <= 1.30x)")


if __name__ == "__main__":
    main()
