"""Recorded episodes as a Minari dataset, and a Minari dataset as a buffer for offline RL.

CartPole is recorded with random actions; its whole episodes are written as a Minari dataset in
the env's own spaces; Minari reads it back; `from_minari` turns it into a buffer again, with `G`.

Run: python examples/minari_roundtrip.py [--episodes 50]   (pip install 'flexibuff_envs[minari]')
Datasets go where Minari keeps them (MINARI_DATASETS_PATH, by default ~/.minari/datasets).
"""

from __future__ import annotations

import argparse
import warnings

import gymnasium as gym
import minari

import flexibuff_envs as fe
from flexibuff_envs.integrations.minari import from_minari, to_minari


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--dataset", default="cartpole/flexibuff-random-v0")
    args = parser.parse_args(argv)
    env = fe.record(gym.make("CartPole-v1"), num_steps=100_000, seed=0)
    env.reset(seed=0)
    env.action_space.seed(0)
    while env.buffer.n_episodes < args.episodes:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    if args.dataset in minari.list_local_datasets():
        minari.delete_dataset(args.dataset)
    with warnings.catch_warnings():  # Minari asks for an author email and a description
        warnings.simplefilter("ignore", UserWarning)
        dataset = to_minari(env.buffer, args.dataset, env=gym.make("CartPole-v1"))
    first = next(iter(minari.load_dataset(args.dataset).iterate_episodes()))
    print(
        f"wrote {args.dataset}: {dataset.total_episodes} episodes, {dataset.total_steps} steps; its first "
        f"episode has {len(first.rewards)} steps and {len(first.observations)} observations (the final one too)"
    )
    offline = from_minari(args.dataset, gamma=0.99)
    batch = offline.sample_transitions(4)
    print(
        f"read back: {len(offline)} rows in {offline.n_episodes} whole episodes; G of 4 drawn rows: "
        f"{[round(float(g), 2) for g in batch.G]}"
    )


if __name__ == "__main__":
    main()
