"""Sampling cost: sample_transitions(256) from a full buffer vs the floor and the peers.

The rows are a rollout (episodes of 200 steps): each obs_ is the next row's obs except at an
episode's end, so ours stores each observation once, as its recorders do, and gathers obs_ back
from the next row. The floor is a bare numpy gather of the same fields from plain arrays, obs and
obs_ apart (uniform indices); its torch form converts to the dtypes our batches have. The peers hold
the same rows and sample with their own ``sample`` into torch. All run side by side, interleaved;
medians are printed with ratios to the floor of the same output.
Run: python benchmarks/bench_sample.py             (1,000,000 CartPole-sized rows)
     python benchmarks/bench_sample.py --frames    (20,000 rows of 84x84x4 uint8 frames)
     python benchmarks/bench_sample.py --fields    (only the five fields a DQN reads, ours with
                                                   fields=...; the peers gather all theirs; a
                                                   second floor holds each observation once, as
                                                   ours does, and patches the episodes' finals)
     python benchmarks/bench_sample.py --fields --next-apart   (ours too with obs_ kept row by
                                                   row, as the floor holds it: twice the memory)
     (peers: pip install -e '.[bench]')
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

#: the floor holding observations as ours does (``--fields``)
ONCE = "bare gather + torch, obs once"
PEERS = [
    "flexibuff 0.3.1",
    "SB3 ReplayBuffer",
    "SB3 optimize_memory_usage",
    "Tianshou ReplayBuffer",
    "TorchRL LazyTensorStorage",
]


def time_it(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(20):
            fn()
        samples.append((time.perf_counter() - start) / 20 * 1e6)
    return statistics.median(samples)


def rollout(rng: np.random.Generator, n: int, frames: bool, episode: int = 200) -> dict[str, np.ndarray]:
    """``n`` transitions of one trajectory in episodes of ``episode`` steps (flat observations)."""

    def draw(rows: int) -> np.ndarray:
        if frames:
            return rng.integers(0, 256, (rows, 84 * 84 * 4), dtype=np.uint8)
        return rng.normal(size=(rows, 4)).astype(np.float32)

    ends = (np.arange(n) % episode) == episode - 1
    trajectory = draw(n + 1)
    obs_ = trajectory[1:].copy()
    obs_[ends] = draw(int(ends.sum()))  # an episode's final observation is not the next one's first
    terminated = ends & (rng.random(n) < 0.5)
    return {
        "obs": trajectory[:n],
        "obs_": obs_,
        "act": rng.integers(0, 2, n),
        "rew": rng.normal(size=n).astype(np.float32),
        "terminated": terminated,
        "truncated": ends & ~terminated,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", action="store_true", help="84x84x4 uint8 observations")
    parser.add_argument("--rows", type=int, default=None, help="default 1,000,000 (20,000 with --frames)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--fields", action="store_true", help="gather only obs, obs_, discrete_actions, individual_rewards, terminated"
    )
    parser.add_argument(
        "--next-apart",
        action="store_true",
        help="also time ours holding obs_ row by row (filled by hand, not compacted)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = args.rows or (20_000 if args.frames else 1_000_000)
    data = rollout(rng, n, args.frames)
    fields = {
        "obs": data["obs"],
        "obs_": data["obs_"],
        "act": data["act"][:, None],
        "rew": data["rew"],
        "terminated": data["terminated"],
        "truncated": data["truncated"],
        "active": np.ones(n, dtype=bool),
        "G": np.zeros(n, dtype=np.float32),
    }  # every field our batches carry
    if args.fields:  # what a DQN reads
        fields = {name: fields[name] for name in ("obs", "obs_", "act", "rew", "terminated")}
    ours_fields = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated") if args.fields else None

    def bare() -> dict[str, np.ndarray]:
        idx = rng.integers(0, n, args.batch)
        return {name: array.take(idx, axis=0) for name, array in fields.items()}

    def bare_torch() -> dict[str, torch.Tensor]:
        out = {}
        for name, array in bare().items():
            tensor = torch.from_numpy(array)
            keep = tensor.dtype in (torch.float32, torch.int64) or (tensor.dtype == torch.uint8 and "obs" in name)
            out[name] = tensor if keep else tensor.float()
        return out

    # the same five fields held as ours holds them, by hand: each observation once (the trajectory's
    # rows), an episode's final observation apart, and per row the final's slot or -1
    once = np.concatenate([data["obs"], data["obs_"][-1:]])
    finals_at = np.flatnonzero(data["terminated"] | data["truncated"])
    slot = np.full(n, -1, dtype=np.int32)
    slot[finals_at] = np.arange(finals_at.size, dtype=np.int32)
    finals = data["obs_"][finals_at]

    def bare_once_torch() -> dict[str, torch.Tensor]:
        idx = rng.integers(0, n, args.batch)
        out = {name: fields[name].take(idx, axis=0) for name in ("obs", "act", "rew", "terminated")}
        out["obs_"] = once.take(idx + 1, axis=0)
        own = slot.take(idx)
        at = np.flatnonzero(own >= 0)
        out["obs_"][at] = finals.take(own[at], axis=0)
        out["terminated"] = out["terminated"].astype(np.float32)
        return {name: torch.from_numpy(array) for name, array in out.items()}

    ours_numpy = loaded(OURS, data, as_torch=False, fields=ours_fields)
    samplers: dict[str, Callable[[], object]] = {
        "bare numpy gather": bare,
        f"{OURS} (numpy)": lambda: ours_numpy(args.batch),
        "bare gather + torch": bare_torch,
    }
    for name in [OURS, *PEERS]:
        if installed(name):
            sample = loaded(name, data, fields=ours_fields) if name == OURS else loaded(name, data)
            samplers[name] = lambda sample=sample: sample(args.batch)
    if args.fields:
        samplers[ONCE] = bare_once_torch
    if args.next_apart:
        apart = loaded(OURS, data, fields=ours_fields, compact=False)
        samplers[f"{OURS}, obs_ apart"] = lambda: apart(args.batch)
    times: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(5):  # interleaved, so machine noise hits all alike
        for name, fn in samplers.items():
            times[name].append(time_it(fn, args.repeats))
    medians = {name: statistics.median(t) for name, t in times.items()}
    rows = "84x84x4 uint8 frames" if args.frames else "CartPole-sized rows"
    print(
        f"sample {args.batch} transitions from {n:,} {rows} (median us per batch; ratio to the bare "
        f"gather with the same output; target: {OURS} <= 1.30x)"
    )
    for name, us in medians.items():
        floor = medians["bare numpy gather" if "numpy" in name else "bare gather + torch"]
        print(f"  {name:<28} {us:10.1f} us   {us / floor:6.2f}x")
    if ONCE in medians:
        print(f"  {OURS} / {ONCE}: {medians[OURS] / medians[ONCE]:.2f}x (the same stored form; target <= 1.30x)")
    missing = [p for p in PEERS if not installed(p)]
    if missing:
        print(f"  not installed: {', '.join(missing)} (pip install -e '.[bench]')")


if __name__ == "__main__":
    main()
