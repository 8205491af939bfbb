"""Double DQN with prioritized replay and 3-step returns on CartPole-v1, from a recorded buffer.

The env is wrapped once; every step lands in the buffer. Each update draws rows in proportion to
priority ** alpha with 3-step returns (`sample_transitions(prioritized=True, n_step=3)`): the batch
holds the discounted reward sum of up to 3 steps, the observation after them and
``discounts = gamma ** k``, so the target is ``r + discounts * (1 - terminated) * Q_target(obs_)``.
A time limit is a truncation, not a termination, so it bootstraps. The loss is weighted by
``batch.weights`` and the new priorities are the TD errors.

CartPole-v1 counts as solved when the mean return of the last 20 episodes reaches 475; training
stops there, or at the step budget. Every seed is trained in turn and one curve per seed plotted.

Run: python examples/dqn_per_cartpole.py [--seeds 0 1 2] [--steps 60000] [--plot dqn_per.png]
"""

from __future__ import annotations

import argparse
import copy
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import flexibuff_envs as fe

FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "discounts")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed")
    parser.add_argument("--steps", type=int, default=60_000, help="env steps per run at most (the budget)")
    parser.add_argument("--n-step", type=int, default=3, help="steps summed in each return")
    parser.add_argument("--alpha", type=float, default=0.6, help="prioritization exponent")
    parser.add_argument(
        "--beta",
        type=float,
        default=0.4,
        help="importance-sampling exponent at the start; it rises to 1 over the budget",
    )
    parser.add_argument("--gamma", type=float, default=0.99, help="discount")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam step size")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per update")
    parser.add_argument("--learning-starts", type=int, default=1_000, help="random steps before the first update")
    parser.add_argument("--target-every", type=int, default=500, help="steps between target network copies")
    parser.add_argument(
        "--explore-steps", type=int, default=10_000, help="steps over which epsilon falls from 1 to 0.01"
    )
    parser.add_argument(
        "--target-return",
        type=float,
        default=475.0,
        help="solved once the mean return of the last 20 episodes reaches this",
    )
    parser.add_argument("--plot", default="", help="write the learning curves to this PNG (needs matplotlib)")
    return parser.parse_args(argv)


def train(args: argparse.Namespace, seed: int) -> tuple[list[int], list[float], int | None]:
    """One run; returns each episode's last step and return, and the step it was solved at."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # a small MLP gains nothing from threads, and runs become repeatable
    rng = np.random.default_rng(seed)
    q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.lr)
    env = fe.record(gym.make("CartPole-v1"), num_steps=args.steps, gamma=args.gamma, alpha=args.alpha, seed=seed)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    ends: list[int] = []
    returns: list[float] = []
    total = 0.0
    for step in range(1, args.steps + 1):
        epsilon = max(0.01, 1.0 - step / args.explore_steps)
        if step <= args.learning_starts or rng.random() < epsilon:
            action = int(env.action_space.sample())
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)).argmax())
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            ends.append(step)
            returns.append(total)
            total = 0.0
            obs, _ = env.reset()
            if len(returns) >= 20 and np.mean(returns[-20:]) >= args.target_return:
                return ends, returns, step
        if step > args.learning_starts:
            beta = args.beta + (1.0 - args.beta) * step / args.steps
            batch = env.buffer.sample_transitions(
                args.batch_size, prioritized=True, beta=beta, n_step=args.n_step, as_torch=True, fields=FIELDS
            )
            with torch.no_grad():  # Double DQN: the online net picks the action, the target net values it
                best = q(batch.obs_).argmax(dim=1, keepdim=True)
                bootstrap = target(batch.obs_).gather(1, best).squeeze(1)
                y = batch.individual_rewards + batch.discounts * (1.0 - batch.terminated) * bootstrap
            taken = q(batch.obs).gather(1, batch.discrete_actions).squeeze(1)
            td = y - taken
            loss = (batch.weights * nn.functional.smooth_l1_loss(taken, y, reduction="none")).mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0)
            optimizer.step()
            env.buffer.update_priorities(batch.idx, td.abs() + 1e-6)  # torch tensors, detached inside
        if step % args.target_every == 0:
            target.load_state_dict(q.state_dict())
    return ends, returns, None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = {}
    for seed in args.seeds:
        start = time.perf_counter()
        ends, returns, solved = train(args, seed)
        runs[seed] = (ends, returns)
        last = np.mean(returns[-20:]) if returns else 0.0
        outcome = f"solved at step {solved}" if solved is not None else f"not solved in {args.steps} steps"
        print(
            f"seed {seed}: {outcome}; {len(returns)} episodes, mean return of the last 20: {last:.1f} "
            f"({time.perf_counter() - start:.0f} s)"
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for seed, (ends, returns) in runs.items():
            ax.plot(ends, returns, label=f"seed {seed}", linewidth=0.8)
        ax.axhline(args.target_return, color="grey", linestyle="--", linewidth=0.8)
        ax.set(
            xlabel="env step",
            ylabel="episode return",
            title=f"Double DQN, prioritized replay, {args.n_step}-step returns: CartPole-v1",
        )
        ax.legend()
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
