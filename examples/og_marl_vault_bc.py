"""Offline multi-agent RL from a flashbax vault in OG-MARL's layout, with PyTorch and no JAX.

mpe2's simple_spread (3 agents, each to cover a landmark) is played by a scripted policy (agent i
walks to landmark i; one move in five random) and recorded. The recording goes out as a vault
laid out as OG-MARL publishes its datasets (``to_vault``). Then, as an OG-MARL user would:
``from_vault`` reads the vault with TensorStore alone, and one policy shared by the agents (its
input: the agent's observation and a one-hot agent id, as OG-MARL's learners give it) learns
their actions by behaviour cloning from ``sample_transitions`` batches, every agent of a step
in one row. The clone then plays the env beside the scripted policy and a random one.

Run: python examples/og_marl_vault_bc.py [--episodes 200] [--updates 1500] [--seeds 0 1 2]
(pip install -e '.[vault,torch,pettingzoo]')
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable

import numpy as np
import torch
from mpe2 import simple_spread_v3
from torch import nn

import flexibuff_envs as fe
from flexibuff_envs.integrations.vault import from_vault, to_vault

AGENTS = 3
#: a step's per-agent policy: (agent index, observation) -> action
Policy = Callable[[int, np.ndarray], int]


def scripted(rng: np.random.Generator) -> Policy:
    """Agent i steps toward landmark i (its relative position is at obs[4 + 2i: 6 + 2i]); one
    move in five is random, so the dataset is not one policy's moves only."""

    def act(agent: int, obs: np.ndarray) -> int:
        if rng.random() < 0.2:
            return int(rng.integers(5))
        dx, dy = obs[4 + 2 * agent : 6 + 2 * agent]
        if abs(dx) > abs(dy):
            return 2 if dx > 0 else 1  # right, left
        return 4 if dy > 0 else 3  # up, down

    return act


def uniform(rng: np.random.Generator) -> Policy:
    return lambda agent, obs: int(rng.integers(5))


def play(policy: Policy, episodes: int, seed: int, env: object | None = None) -> float:
    """Mean return (summed over agents and steps) of ``policy`` over ``episodes`` episodes."""
    env = env or simple_spread_v3.parallel_env(max_cycles=25)
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        while env.agents:
            obs, rewards, _, _, _ = env.step({agent: policy(int(agent[-1]), obs[agent]) for agent in env.agents})
            total += sum(rewards.values()) / AGENTS  # simple_spread's reward is shared: count it once
    return total / episodes


def clone(buffer: fe.FlexibleBuffer, updates: int, seed: int) -> Policy:
    """A shared MLP over (observation, agent id), trained on the agents' actions."""
    torch.manual_seed(seed)
    ids = torch.eye(AGENTS)
    net = nn.Sequential(nn.Linear(18 + AGENTS, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(updates):
        batch = buffer.sample_transitions(256, as_torch=True)  # obs [agents, 256, 18], actions [agents, 256, 1]
        inputs = torch.cat([batch.obs, ids[:, None].expand(-1, len(batch.obs[0]), -1)], dim=-1)
        loss = nn.functional.cross_entropy(net(inputs).reshape(-1, 5), batch.discrete_actions.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def act(agent: int, obs: np.ndarray) -> int:
        with torch.no_grad():
            return int(net(torch.cat([torch.as_tensor(obs), ids[agent]])).argmax())

    return act


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200, help="episodes of the scripted policy to record")
    parser.add_argument("--updates", type=int, default=1500, help="behaviour-cloning updates of 256 rows")
    parser.add_argument("--evaluate", type=int, default=20, help="episodes each policy plays per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    rows: dict[str, list[float]] = {"scripted (the data)": [], "behaviour clone": [], "random": []}
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        env = fe.record(simple_spread_v3.parallel_env(max_cycles=25), num_steps=args.episodes * 25, seed=seed)
        data_return = play(scripted(rng), args.episodes, seed=1000 * seed, env=env)
        with tempfile.TemporaryDirectory() as directory:
            path = to_vault(env.buffer, directory, vault_name="simple_spread.vlt", vault_uid="Scripted")
            offline = from_vault(path, seed=seed)  # what an OG-MARL user does with a vault: no JAX
        if seed == args.seeds[0]:
            print(
                f"vault {os.path.relpath(path, directory)}: {len(offline):,} steps of {AGENTS} agents in "
                f"{offline.n_episodes} episodes; recorded return {data_return:.1f}"
            )
        rows["behaviour clone"].append(play(clone(offline, args.updates, seed), args.evaluate, seed=10**6))
        rows["scripted (the data)"].append(play(scripted(rng), args.evaluate, seed=10**6))
        rows["random"].append(play(uniform(rng), args.evaluate, seed=10**6))
    print(f"mean return over {args.evaluate} episodes, seeds {args.seeds} (mean +- std over seeds):")
    for name, returns in rows.items():
        print(f"  {name:<20} {np.mean(returns):7.1f} +- {np.std(returns):4.1f}   {[round(r, 1) for r in returns]}")


if __name__ == "__main__":
    main()
