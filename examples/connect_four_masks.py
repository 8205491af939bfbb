"""Record PettingZoo connect four with its action masks, then read the buffer back. Nothing is trained.

The AEC env is wrapped once; the layout (2 agents, a 6x7x2 board of int8, one head of 7 moves,
masks) is inferred from its spaces. A batch of transitions shows what a DQN-style learner gets:
every agent's board, mask, move and reward at the same row; an episode shows the returns G.

Run: python examples/connect_four_masks.py [--games 200] [--batch-size 4]
"""

from __future__ import annotations

import argparse

import numpy as np
from pettingzoo.classic import connect_four_v3

import flexibuff_envs as fe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", type=int, default=200, help="games to record")
    parser.add_argument("--batch-size", type=int, default=4, help="transitions to sample and print")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env and the moves")
    return parser.parse_args(argv)


def record(games: int, seed: int) -> fe.FlexibleBuffer:
    """Play ``games`` games of uniformly random legal moves; every move lands in the buffer."""
    env = fe.record(connect_four_v3.env(), num_steps=games * 21, gamma=0.99, seed=seed)  # <= 21 moves per player
    rng = np.random.default_rng(seed)
    for game in range(games):
        env.reset(seed=seed + game)
        for _ in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            env.step(None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"]))))
    env.close()
    return env.buffer


def board(obs: np.ndarray) -> str:
    """A flat 84-value observation as the 6x7 board: X the player to move, O the opponent."""
    planes = obs.reshape(6, 7, 2)
    return "\n".join("    " + "".join("X" if me else "O" if them else "." for me, them in row) for row in planes)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    buffer = record(args.games, args.seed)
    spec = buffer.spec
    print(
        f"recorded {buffer.n_episodes} games in {len(buffer)} rows: agents {spec.agent_ids}, "
        f"obs {spec.obs_size} x {spec.obs_dtype}, moves {spec.discrete_action_cardinalities}, "
        f"masks {spec.action_mask}"
    )

    batch = buffer.sample_transitions(args.batch_size)
    print(f"\nsample_transitions({args.batch_size}): per-agent fields are [agent, row, ...]")
    for name in ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "active"):
        value = getattr(batch, name)
        print(f"  {name:<20} {value.shape!s:<14} {value.dtype}")
    print(f"  {'action_mask':<20} {len(batch.action_mask)} head(s) of {batch.action_mask[0].shape} bool")

    agent, i = 0, 0
    move = batch.discrete_actions[agent, i, 0]
    print(
        f"\n{spec.agent_ids[agent]} at buffer row {batch.idx[i]}: legal columns "
        f"{np.flatnonzero(batch.action_mask[0][agent, i]).tolist()}, played {move}, "
        f"reward {batch.individual_rewards[agent, i]:+.0f}"
    )
    print(board(batch.obs[agent, i]))
    print("  its board at its next turn (or the final board):")
    print(board(batch.obs_[agent, i]))

    [episode] = buffer.sample_episodes(n_episodes=1)
    winner = (
        "draw"
        if not episode.individual_rewards.any()
        else spec.agent_ids[int(np.argmax(episode.individual_rewards.sum(axis=1)))]
    )
    print(f"\none whole game ({len(episode)} rows, {winner} won): returns G per move, gamma 0.99")
    for agent, name in enumerate(spec.agent_ids):
        g = episode.G[agent][episode.active[agent]]
        print(f"  {name}: {np.array2string(g, precision=2, max_line_width=100)}")


if __name__ == "__main__":
    main()
