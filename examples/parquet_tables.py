"""A multi-agent recording as Parquet tables, read by pandas and by Hugging Face ``datasets``.

PettingZoo's knights_archers_zombies (agents die when a zombie reaches them) is recorded with
random moves and written with ``to_parquet``: one row per episode, step and agent in
``agents/``, one per step in ``steps/``. pandas then answers the questions a tabular tool is
for (how long each agent lived, its rewards, how its episodes ended), and ``datasets`` streams
the rows where an agent acted into PyTorch batches, as a Hugging Face training loop reads them.

Run: python examples/parquet_tables.py [--episodes 10] [--seed 0]
(pip install -e '.[parquet,pettingzoo]' pandas datasets)
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import pandas as pd
from pettingzoo.butterfly import knights_archers_zombies_v11

import flexibuff_envs as fe
from flexibuff_envs.integrations.parquet import to_parquet


def record(episodes: int, seed: int) -> fe.FlexibleBuffer:
    env = fe.record(knights_archers_zombies_v11.parallel_env(max_cycles=300), num_steps=episodes * 300, seed=seed)
    rng = np.random.default_rng(seed)
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        while env.agents:
            env.step({agent: int(rng.integers(6)) for agent in env.agents})
    return env.buffer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        path = to_parquet(record(args.episodes, args.seed), os.path.join(directory, "kaz"))

        # pandas: every agent's row at every step; `active` says whether it was there
        agents = pd.read_parquet(
            os.path.join(path, "agents"),
            columns=["episode", "step", "agent", "active", "individual_rewards", "terminated"],
        )
        here = agents[agents.active]
        table = here.groupby("agent", observed=True).agg(
            episodes=("episode", "nunique"),
            steps=("step", "size"),
            mean_reward=("individual_rewards", "mean"),
            ended=("terminated", "sum"),
        )
        print(
            f"pandas: {len(agents):,} rows of {agents.agent.nunique()} agents in {agents.episode.nunique()} "
            f"episodes, {len(here):,} of them active"
        )
        print(table.to_string())

        # Hugging Face datasets: the active rows as PyTorch batches
        from datasets import load_dataset

        rows = load_dataset(
            "parquet",
            data_files=os.path.join(path, "agents", "*.parquet"),
            split="train",
            cache_dir=os.path.join(directory, "hf"),
        )
        rows = rows.filter(lambda row: row["active"]).select_columns(["obs", "discrete_actions", "G"])
        batch = next(iter(rows.with_format("torch").iter(batch_size=64)))
        print(
            f"datasets: {rows.num_rows:,} active rows; a batch of {len(batch['obs'])}: obs "
            f"{tuple(batch['obs'].shape)} {batch['obs'].dtype}, actions {tuple(batch['discrete_actions'].shape)}, "
            f"G {tuple(batch['G'].shape)}"
        )


if __name__ == "__main__":
    main()
