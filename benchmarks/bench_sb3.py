"""SB3's off-policy loop on our `integrations.sb3.ReplayBuffer` vs on SB3's own `ReplayBuffer`.

SB3 adds one transition per sub-env step and, with ``train_freq=1``, samples a batch after each:
- the add + sample cycle on a buffer holding 20,000 CartPole transitions (``--batch`` rows);
- ``DQN.learn`` on CartPole-v1 (``train_freq=1``, batch 64, one torch thread), per env step.
Both run side by side, interleaved; medians and the ratio to SB3's own buffer are printed.
Run: python benchmarks/bench_sb3.py [--rounds 5] [--batch 64] [--learn-steps 3000]
     (needs pip install -e '.[sb3]')
"""

from __future__ import annotations

import argparse
import statistics
import time

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
    us = {name: statistics.median(t) for name, t in timings.items()}
    base = us["SB3 ReplayBuffer"]
    print(title)
    for name, value in us.items():
        print(f"  {name:<30} {value:9.1f} us  {value / base:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--learn-steps", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n_envs in (1, 4):
        buffers = {name: filled(cls, n_envs, 20_000) for name, cls in BUFFERS.items()}
        timings: dict[str, list[float]] = {name: [] for name in BUFFERS}
        for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits both alike
            for name, (buffer, obs) in buffers.items():
                timings[name].append(cycle(buffer, obs, args.batch))
        report(
            f"add (n_envs={n_envs}) + sample({args.batch}), {args.rounds} rounds (median us; ratio to SB3's)", timings
        )
    timings = {name: [] for name in BUFFERS}
    for _ in range(args.rounds):
        for name, cls in BUFFERS.items():
            timings[name].append(learn(cls, args.learn_steps))
    report(
        f"DQN.learn on CartPole-v1, train_freq=1, {args.learn_steps} steps x {args.rounds} rounds "
        "(median us per env step)",
        timings,
    )


if __name__ == "__main__":
    main()
