"""Sampling cost: sample_transitions(256, as_torch=True) from 1,000,000 rows vs the floor and the peers.

The floor is a bare numpy gather of the same fields from plain arrays (uniform indices, torch
tensors of the same dtypes out). The peers hold the same rows (CartPole-sized: 4 float32 obs,
obs_, action, reward, flags) and sample with their own ``sample`` into torch batches. All are timed
side by side in one run, interleaved, and the medians printed with ratios to ours.
Run: python benchmarks/bench_sample.py [--rows N] [--batch B]   (peers: pip install -e '.[bench]')
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import OURS, installed, loaded

PEERS = ["flexibuff 0.3.1", "SB3 ReplayBuffer", "SB3 optimize_memory_usage", "Tianshou ReplayBuffer",
         "TorchRL LazyTensorStorage"]


def time_it(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(20):
            fn()
        samples.append((time.perf_counter() - start) / 20 * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = args.rows
    ends = (np.arange(n) % 200) == 199
    data = {"obs": rng.normal(size=(n, 4)).astype(np.float32), "obs_": rng.normal(size=(n, 4)).astype(np.float32),
            "act": rng.integers(0, 2, n), "rew": rng.normal(size=n).astype(np.float32),
            "terminated": ends & (rng.random(n) < 0.5)}
    data["truncated"] = ends & ~data["terminated"]
    fields = {"obs": data["obs"], "obs_": data["obs_"], "act": data["act"][:, None], "rew": data["rew"],
              "terminated": data["terminated"], "truncated": data["truncated"], "active": np.ones(n, dtype=bool),
              "G": np.zeros(n, dtype=np.float32)}  # every field our batches carry

    def floor() -> dict[str, torch.Tensor]:
        idx = rng.integers(0, n, args.batch)
        out = {}
        for name, array in fields.items():
            tensor = torch.from_numpy(array.take(idx, axis=0))
            out[name] = tensor if tensor.dtype in (torch.float32, torch.int64) else tensor.float()
        return out

    samplers: dict[str, Callable[[], object]] = {"bare numpy gather + torch": floor}
    for name in [OURS, *PEERS]:
        if installed(name):
            sample = loaded(name, data)
            samplers[name] = lambda sample=sample: sample(args.batch)
    times: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(5):  # interleaved, so machine noise hits all alike
        for name, fn in samplers.items():
            times[name].append(time_it(fn, args.repeats))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"sample {args.batch} transitions as torch from {n:,} rows (median us per batch; ratio to "
          f"{OURS}; 'bare' is the floor, target: {OURS} <= 1.30x bare)")
    for name, us in medians.items():
        print(f"  {name:<28} {us:8.1f} us   {us / medians[OURS]:6.2f}x")
    missing = [p for p in PEERS if not installed(p)]
    if missing:
        print(f"  not installed: {', '.join(missing)} (pip install -e '.[bench]')")


if __name__ == "__main__":
    main()
