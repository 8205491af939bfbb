"""REINFORCE on CartPole-v1, learning from the returns G the recorder writes when an episode ends.

No return computation in the training loop: the env is wrapped once, each batch of episodes is
played, and `sample_episodes` hands them back whole with G = r_t + gamma * r_{t+1} + ... per step.

Run: python examples/reinforce_cartpole.py [--episodes 1500] [--plot reinforce.png]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

import flexibuff_envs as fe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1500, help="training episodes at most")
    parser.add_argument("--batch-episodes", type=int, default=8, help="episodes per policy update")
    parser.add_argument("--lr", type=float, default=5e-3, help="Adam step size")
    parser.add_argument("--gamma", type=float, default=0.99, help="discount of the recorded G")
    parser.add_argument(
        "--target", type=float, default=475.0, help="stop once the mean return of the last 50 episodes reaches this"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the env, the actions and torch")
    parser.add_argument("--plot", default="", help="write the learning curve to this PNG (needs matplotlib)")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> list[float]:
    """Train; returns every episode's return in order."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # a small MLP gains nothing from threads, and runs become repeatable
    policy = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    # one batch of episodes at a time: 8 episodes of at most 500 steps
    env = fe.record(gym.make("CartPole-v1"), num_steps=args.batch_episodes * 500, gamma=args.gamma, seed=args.seed)
    obs, _ = env.reset(seed=args.seed)
    returns: list[float] = []
    while len(returns) < args.episodes and not np.mean(returns[-50:] or [0]) >= args.target:
        env.buffer.clear()
        for _ in range(args.batch_episodes):
            done, total = False, 0.0
            while not done:
                with torch.no_grad():
                    action = Categorical(logits=policy(torch.as_tensor(obs))).sample()
                obs, reward, terminated, truncated, _ = env.step(int(action))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
            obs, _ = env.reset()
        episodes = env.buffer.sample_episodes(n_episodes=args.batch_episodes, as_torch=True)
        obs_b = torch.cat([e.obs for e in episodes])
        actions = torch.cat([e.discrete_actions[:, 0] for e in episodes])
        g = torch.cat([e.G for e in episodes])
        g = (g - g.mean()) / (g.std() + 1e-8)  # the batch mean is the baseline
        loss = -(Categorical(logits=policy(obs_b)).log_prob(actions) * g).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    env.close()
    return returns


def plot(returns: list[float], path: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    episodes = np.arange(1, len(returns) + 1)
    window = min(50, len(returns))
    smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(episodes, returns, alpha=0.3, linewidth=0.8, label="episode return")
    ax.plot(episodes[window - 1 :], smooth, label=f"mean of last {window}")
    ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    ax.set(xlabel="episode", ylabel="return", title="REINFORCE on CartPole-v1 from recorded G")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    returns = train(args)
    print(
        f"{len(returns)} episodes in {time.perf_counter() - start:.0f} s; mean return of the last 50: "
        f"{np.mean(returns[-50:]):.1f} (first 50: {np.mean(returns[:50]):.1f})"
    )
    if args.plot:
        plot(returns, args.plot, args.target)
        print(f"learning curve: {args.plot}")


if __name__ == "__main__":
    main()
