"""GAE(lambda) plus returns over a 100,000-step rollout of about 2,000 episodes, half of them truncated.

Side by side in one run: flexibuff_envs.index.returns.gae writing into preallocated arrays (as a buffer
does), the same allocating its results, a plain Python loop, and each installed peer's own GAE
from the same arrays (Tianshou's numba kernel, TorchRL's vectorized torch function, SB3's
RolloutBuffer, flexibuff 0.3.1's loop). Each peer's advantages are checked against the plain loop
first. Medians.
Run: python benchmarks/bench_gae.py   (peers: pip install -e '.[bench]')
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from flexibuff_envs.index.returns import gae

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import installed

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


def peer_gaes(
    rewards: np.ndarray, values: np.ndarray, ends: np.ndarray, bootstrap: np.ndarray
) -> dict[str, Callable[[], np.ndarray]]:
    """Each installed peer's GAE on the same rollout; each returns the advantages as numpy."""
    # the value after each step: the next step's, or at an episode end the bootstrap (0 if terminated)
    following = lambda: np.where(ends, bootstrap, np.roll(values, -1))
    out: dict[str, Callable[[], np.ndarray]] = {}
    if installed("Tianshou ReplayBuffer"):
        from tianshou.algorithm.algorithm_base import _gae

        out["Tianshou (numba)"] = lambda: _gae(values, following(), rewards, ends, GAMMA, LAM)
    if installed("TorchRL LazyTensorStorage"):
        import torch
        from torchrl.objectives.value.functional import generalized_advantage_estimate

        column = lambda a: torch.from_numpy(np.ascontiguousarray(a))[:, None]
        ended_for_good = ends & (bootstrap == 0)

        def torchrl() -> np.ndarray:
            advantage, _ = generalized_advantage_estimate(
                GAMMA, LAM, column(values), column(following()), column(rewards), column(ends), column(ended_for_good)
            )
            return advantage[:, 0].numpy()

        out["TorchRL (torch)"] = torchrl
    if installed("SB3 ReplayBuffer"):
        import torch
        from gymnasium import spaces
        from stable_baselines3.common.buffers import RolloutBuffer

        sb = RolloutBuffer(T, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device="cpu", gae_lambda=LAM, gamma=GAMMA)
        # SB3 folds a truncation's bootstrap into the reward and reads episode ends from episode_starts
        sb.rewards[:, 0] = rewards + GAMMA * np.where(ends, bootstrap, 0.0)
        sb.values[:, 0] = values
        sb.episode_starts[1:, 0] = ends[:-1]

        def sb3() -> np.ndarray:
            sb.compute_returns_and_advantage(last_values=torch.zeros(1), dones=np.ones(1))
            return sb.advantages[:, 0]

        out["SB3 RolloutBuffer (loop)"] = sb3
    if installed("flexibuff 0.3.1"):
        import torch
        from flexibuff import FlexibleBuffer

        r, v = torch.from_numpy(rewards), torch.from_numpy(values)
        term = torch.from_numpy(ends & (bootstrap == 0)).float()
        trunc = torch.from_numpy(ends & (bootstrap != 0)).float()
        boot = torch.from_numpy(bootstrap)
        out["flexibuff 0.3.1 (loop)"] = lambda: FlexibleBuffer.GAE(r, v, term, 0.0, GAMMA, LAM, trunc, boot)[1][
            :, 0
        ].numpy()
    return out


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
    print(f"GAE + returns, {T} steps, {int(ends.sum())} episodes (median ms; ratio to ours into buffers)")
    print(f"  flexibuff_envs gae(..., out=buffers)  {into:9.3f} ms  1.00x  (target <= 1 ms)")
    print(f"  flexibuff_envs gae(...) allocating    {allocating:9.3f} ms  {allocating / into:5.2f}x")
    print(f"  plain Python loop                     {loop:9.1f} ms  {loop / into:5.0f}x")
    for name, fn in peer_gaes(rewards, values, ends, bootstrap).items():
        wrong = int((~np.isclose(fn(), reference, rtol=1e-3, atol=1e-3)).sum())
        ms = median_ms(fn, 3 if "loop" in name else 101)
        print(f"  {name:<37} {ms:9.3f} ms  {ms / into:5.2f}x" + (f"  ({wrong} advantages wrong)" if wrong else ""))


if __name__ == "__main__":
    main()
