"""PPO on CartPole-v1 with flexibuff_envs doing the bookkeeping (CleanRL's recipe, no hand-made buffer).

The vector env is wrapped once; the agent annotates each step with its value and log prob; the
buffer computes GAE when episodes end (bootstrapping truncations with the critic) and at every
rollout cut (`finish_path`), and `minibatches` serves the PPO epochs.

Run: python examples/ppo_cartpole.py [--total-timesteps 150000] [--plot curve.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

import flexibuff_envs as fe


@dataclass
class Args:
    seed: int = 1  # seed of the envs, the policy and torch
    total_timesteps: int = 150_000  # env steps over all sub-envs
    num_envs: int = 4  # sub-envs of the vector env
    num_steps: int = 128  # steps per sub-env per rollout
    learning_rate: float = 1e-3  # Adam step size, annealed linearly to 0
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE's lambda
    num_minibatches: int = 4  # minibatches per epoch
    update_epochs: int = 4  # passes over each rollout
    clip_coef: float = 0.2  # PPO's surrogate clipping
    ent_coef: float = 0.01  # entropy bonus
    vf_coef: float = 0.5  # value loss weight
    max_grad_norm: float = 0.5  # gradient clipping
    plot: str = ""  # write the learning curve to this PNG (needs matplotlib)


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__)
    source = Path(__file__).read_text()
    for field in dataclasses.fields(Args):
        comment = source.split(f"    {field.name}: ", 1)[1].split("\n", 1)[0].split("# ", 1)[-1]
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default, help=comment
        )
    return Args(**vars(parser.parse_args()))


def layer(n_in: int, n_out: int, std: float = np.sqrt(2)) -> nn.Linear:
    linear = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer(n_obs, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(n_obs, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, n_actions, 0.01))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.actor(obs))


def train(args: Args) -> list[tuple[int, float]]:
    """Train; returns (env step, mean return of the last 20 episodes) after each rollout."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # a 64-unit MLP gains nothing from threads, and runs become repeatable
    vec = gym.wrappers.vector.RecordEpisodeStatistics(gym.make_vec("CartPole-v1", num_envs=args.num_envs))
    agent = Agent(4, 2)

    def critic(obs: np.ndarray) -> float:  # V of a truncated episode's final observation
        with torch.no_grad():
            return float(agent.value(torch.as_tensor(obs)))

    envs = fe.record(
        vec, num_steps=args.num_steps, gamma=args.gamma, gae_lambda=args.gae_lambda, bootstrap_fn=critic, seed=args.seed
    )  # seed: minibatch shuffling
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    batch_size = args.num_envs * args.num_steps
    rollouts = args.total_timesteps // batch_size
    obs, _ = envs.reset(seed=args.seed)
    returns: list[float] = []
    curve: list[tuple[int, float]] = []
    for rollout in range(1, rollouts + 1):
        optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (rollout - 1) / rollouts)
        envs.buffer.clear()
        for _ in range(args.num_steps):
            with torch.no_grad():
                x = torch.as_tensor(obs)
                dist = agent.policy(x)
                action = dist.sample()
                envs.annotate(values=agent.value(x).numpy(), discrete_log_probs=dist.log_prob(action)[:, None].numpy())
            obs, _, _, _, info = envs.step(action.numpy())
            if "episode" in info:
                returns.extend(info["episode"]["r"][info["_episode"]].tolist())
        with torch.no_grad():
            envs.buffer.finish_path(agent.value(torch.as_tensor(obs)).numpy())
        for _ in range(args.update_epochs):
            for mb in envs.buffer.minibatches(
                batch_size // args.num_minibatches, as_torch=True, normalize_advantages=True
            ):
                dist = agent.policy(mb.obs)
                log_ratio = dist.log_prob(mb.discrete_actions[:, 0]) - mb.discrete_log_probs[:, 0]
                ratio = log_ratio.exp()
                adv = mb.advantages
                policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                value_loss = 0.5 * ((agent.value(mb.obs) - mb.returns) ** 2).mean()
                loss = policy_loss - args.ent_coef * dist.entropy().mean() + args.vf_coef * value_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        if returns:
            curve.append((rollout * batch_size, float(np.mean(returns[-20:]))))
    envs.close()
    return curve


def plot(curve: list[tuple[int, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, means = zip(*curve)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, means)
    ax.axhline(400, color="grey", linestyle="--", linewidth=0.8)
    ax.set(xlabel="env steps", ylabel="mean return (last 20 episodes)", title="PPO on CartPole-v1, flexibuff_envs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    curve = train(args)
    best = max(curve, key=lambda point: point[1]) if curve else (0, float("nan"))
    first_400 = next((step for step, mean in curve if mean >= 400), None)
    print(
        f"{args.total_timesteps} steps in {time.perf_counter() - start:.0f} s; final mean return "
        f"{curve[-1][1] if curve else float('nan'):.1f}, best {best[1]:.1f} at step {best[0]}, "
        f"first >= 400 at step {first_400}"
    )
    if args.plot:
        plot(curve, args.plot)
        print(f"learning curve: {args.plot}")


if __name__ == "__main__":
    main()
