"""A multi-agent recording as Minari datasets, one per agent, each carrying the rest of the step.

Minari holds one agent's episodes per dataset. mpe2's simple_spread (3 agents, a global state)
is recorded with random moves and written with ``to_minari_agents``: the datasets
``NAMESPACE/agent_0-v0``, ... under one namespace, each in that agent's own spaces, with the
global state, the other agents' actions and whether they acted in its infos. Read back as a
Minari user reads them, they give what a centralised critic (MADDPG, MAPPO) takes at a step:
the agent's observation, the state and the joint action.

Run: python examples/minari_agents.py [--episodes 20] [--namespace simple_spread/random]
(pip install -e '.[minari,pettingzoo]'; datasets go to MINARI_DATASETS_PATH, by default
~/.minari/datasets)
"""

from __future__ import annotations

import argparse
import warnings

import minari
import numpy as np
from mpe2 import simple_spread_v3

import flexibuff_envs as fe
from flexibuff_envs.integrations.minari import to_minari_agents


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--namespace", default="simple_spread/random")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    env = fe.record(simple_spread_v3.parallel_env(max_cycles=25), num_steps=args.episodes * 25, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    for episode in range(args.episodes):
        env.reset(seed=args.seed + episode)
        while env.agents:
            env.step({agent: int(rng.integers(5)) for agent in env.agents})
    for agent in env.possible_agents:  # a rerun replaces the datasets
        if f"{args.namespace}/{agent}-v0" in minari.list_local_datasets():
            minari.delete_dataset(f"{args.namespace}/{agent}-v0")
    with warnings.catch_warnings():  # Minari asks for an author, their email and a code link
        warnings.simplefilter("ignore", UserWarning)
        datasets = to_minari_agents(env.buffer, args.namespace, simple_spread_v3.parallel_env())
    for agent, dataset in datasets.items():
        print(f"wrote {args.namespace}/{agent}-v0: {dataset.total_episodes} episodes, {dataset.total_steps} steps")

    # a Minari user's side: one agent's dataset, and a critic's input built from its infos
    dataset = minari.load_dataset(f"{args.namespace}/agent_0-v0")
    episode = next(iter(dataset.iterate_episodes()))
    others = episode.infos["actions"]  # each other agent's actions, padded by one step as Minari pads actions
    joint = np.stack([episode.actions, *(others[name][:-1] for name in sorted(others))], axis=-1)
    critic_input = np.concatenate([episode.observations[:-1], episode.infos["state"][:-1], joint], axis=-1)
    print(
        f"agent_0's first episode: observations {episode.observations.shape}, state "
        f"{episode.infos['state'].shape}, the others' actions {sorted(others)}; a critic's input "
        f"(obs, state, joint action) {critic_input.shape}"
    )


if __name__ == "__main__":
    main()
