"""SB3's off-policy loop on our `integrations.sb3.ReplayBuffer` vs on SB3's own `ReplayBuffer`.

SB3 adds one transition per sub-env step and, with ``train_freq=1``, samples a batch after each:
- the add + sample cycle on a buffer holding 20,000 CartPole transitions (``--batch`` rows);
- ``DQN.learn`` on CartPole-v1 (``train_freq=1``, batch 64, one torch thread), per env step.
Both run side by side, back to back in each round (the order reversed every other round);
medians, and the median of the rounds' own ratios to SB3's buffer with the lowest and highest.
Run: python benchmarks/bench_sb3.py [--rounds 5] [--batch 64] [--learn-steps 3000]
     (needs pip install -e '.[sb3]')
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

from flexibuff_envs.integrations.sb3 import ReplayBuffer

BUFFERS = {"SB3 ReplayBuffer": SB3ReplayBuffer, "flexibuff_envs ReplayBuffer": ReplayBuffer}


def filled(cls: type, n_envs: int, transitions: int) -> tuple[SB3ReplayBuffer, np.ndarray]:
    """A buffer of ``cls`` holding ``transitions`` random CartPole-sized ones, episodes of 25 steps."""
    env = gym.make("CartPole-v1")
    buffer = cls(2 * transitions, env.observation_space, env.action_space, device="cpu", n_envs=n_envs)
    rng = np.random.default_rng(0)
    obs = rng.random((n_envs, 4), dtype=np.float32)
    for step in range(transitions // n_envs):
        next_obs = rng.random((n_envs, 4), dtype=np.float32)
        buffer.add(
            obs,
            next_obs,
            np.ones(n_envs, dtype=np.int64),
            np.ones(n_envs),
            np.full(n_envs, step % 25 == 24),
            [{}] * n_envs,
        )
        obs = next_obs
    return buffer, obs


def cycle(buffer: SB3ReplayBuffer, obs: np.ndarray, batch: int, n: int = 2000) -> float:
    """us per ``add`` of one transition per sub-env followed by ``sample(batch)``."""
    n_envs = obs.shape[0]
    action, reward, done, infos = (
        np.ones(n_envs, dtype=np.int64),
        np.ones(n_envs),
        np.zeros(n_envs, bool),
        [{}] * n_envs,
    )
    start = time.perf_counter()
    for _ in range(n):
        buffer.add(obs, obs, action, reward, done, infos)
        buffer.sample(batch)
    return (time.perf_counter() - start) / n * 1e6


def learn(cls: type, steps: int) -> float:
    """us per env step of ``DQN.learn`` on CartPole-v1 with ``cls`` as its replay buffer."""
    model = DQN(
        "MlpPolicy",
        gym.make("CartPole-v1"),
        learning_starts=100,
        train_freq=1,
        batch_size=64,
        seed=0,
        device="cpu",
        replay_buffer_class=cls,
    )
    start = time.perf_counter()
    model.learn(steps)
    return (time.perf_counter() - start) / steps * 1e6


def report(title: str, timings: dict[str, list[float]]) -> None:
    """Each buffer's median, and the median of the rounds' own ratios to SB3's (lowest-highest)."""
    base = timings["SB3 ReplayBuffer"]
    print(title)
    for name, values in timings.items():
        ratios = sorted(value / sb3 for value, sb3 in zip(values, base))
        spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if name != "SB3 ReplayBuffer" else ""
        print(f"  {name:<30} {statistics.median(values):9.1f} us  {statistics.median(ratios):5.2f}x{spread}")


def turns(rounds: int, runs: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """``rounds`` rounds of every run, back to back, their order reversed every other round (so
    drift on a shared machine hits all alike): each run's timings."""
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(rounds):
        for name, run in list(runs.items())[:: -1 if i % 2 else 1]:
            timings[name].append(run())
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--learn-steps", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n_envs in (1, 4):
        buffers = {name: filled(cls, n_envs, 20_000) for name, cls in BUFFERS.items()}
        timings = turns(
            args.rounds,
            {name: functools.partial(cycle, buffer, obs, args.batch) for name, (buffer, obs) in buffers.items()},
        )
        report(
            f"add (n_envs={n_envs}) + sample({args.batch}), {args.rounds} rounds "
            "(median us; median ratio to SB3's, lowest-highest)",
            timings,
        )
    timings = turns(
        args.rounds, {name: functools.partial(learn, cls, args.learn_steps) for name, cls in BUFFERS.items()}
    )
    report(
        f"DQN.learn on CartPole-v1, train_freq=1, {args.learn_steps} steps x {args.rounds} rounds "
        "(median us per env step; median ratio to SB3's, lowest-highest)",
        timings,
    )


if __name__ == "__main__":
    main()
