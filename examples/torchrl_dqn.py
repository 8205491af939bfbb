"""A TorchRL DQN loss trained on batches of a recorded buffer, handed over as TensorDicts.

CartPole is recorded with random actions; a Q-network then learns from `sample_transitions(...)
.to_tensordict()` through TorchRL's `DQNLoss` (a target network updated softly), and is
evaluated greedily on the env.

Run: python examples/torchrl_dqn.py [--steps 20000] [--updates 3000]   (pip install 'flexibuff_envs[torchrl]')
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from torchrl.data import Categorical
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

import flexibuff_envs as fe


def greedy_return(actor: QValueActor, episodes: int = 10) -> float:
    env, total = gym.make("CartPole-v1"), 0.0
    for k in range(episodes):
        obs, _ = env.reset(seed=100 + k)
        done = False
        while not done:
            with torch.no_grad():
                action = int(actor.module[0](torch.as_tensor(obs)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    return total / episodes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="random steps recorded")
    parser.add_argument("--updates", type=int, default=3000, help="gradient steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    env = fe.record(gym.make("CartPole-v1"), num_steps=args.steps, seed=args.seed)
    env.reset(seed=args.seed)
    env.action_space.seed(args.seed)
    for _ in range(args.steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    actor = QValueActor(
        MLP(in_features=4, out_features=2, num_cells=[64, 64]), in_keys=["observation"], spec=Categorical(2)
    )
    loss_module = DQNLoss(actor, action_space="categorical", delay_value=True)
    loss_module.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss_module, eps=0.99)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=1e-3)
    before = greedy_return(actor)
    losses = []
    for _ in range(args.updates):
        loss = loss_module(env.buffer.sample_transitions(128).to_tensordict())["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        target.step()
        losses.append(float(loss.detach()))
    print(
        f"{args.steps} random steps recorded; {args.updates} DQNLoss updates on TensorDict batches: "
        f"loss {np.mean(losses[:50]):.3f} -> {np.mean(losses[-50:]):.3f}; greedy return {before:.1f} -> "
        f"{greedy_return(actor):.1f}"
    )


if __name__ == "__main__":
    main()
