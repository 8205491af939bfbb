"""Independent DQN on PettingZoo tic-tac-toe: one Q-network per seat, both learning from one buffer.

The AEC env is wrapped once. Row k of the buffer holds each player's k-th move: its board, its
legal-move mask, the move, the reward that move earned (a loss lands on the loser's last move),
and the board and mask at its next turn. Each learner reads its own agent's rows of a sampled
batch by name (`batch.by_agent()`: `batch.obs["player_1"]`, as AgileRL's learners read theirs).
In training, every game puts one learner against a uniformly random opponent (seats alternate);
Q-learning is off-policy, so both learners also learn from the rows of the random seat.

Run: python examples/dqn_tictactoe.py [--episodes 6000] [--plot dqn_tictactoe.png]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from pettingzoo.classic import tictactoe_v3
from torch import nn

import flexibuff_envs as fe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=6000, help="training games")
    parser.add_argument("--eval-games", type=int, default=1000, help="games per seat for the final win rates")
    parser.add_argument("--curve-games", type=int, default=200, help="games per seat at each curve point")
    parser.add_argument("--batch-size", type=int, default=128, help="rows per gradient step")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam step size")
    parser.add_argument("--gamma", type=float, default=0.9, help="discount")
    parser.add_argument("--epsilon-games", type=int, default=3000, help="games over which epsilon falls 1 -> 0.05")
    parser.add_argument("--target-every", type=int, default=250, help="gradient steps between target syncs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env, the moves and torch")
    parser.add_argument("--plot", default="", help="write the win-rate curve to this PNG (needs matplotlib)")
    return parser.parse_args(argv)


def q_network() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(18, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 9))


def greedy(q: nn.Module, board: np.ndarray, mask: np.ndarray) -> int:
    with torch.no_grad():
        values = q(torch.as_tensor(board, dtype=torch.float32)[None])[0]
    return int(values.masked_fill(~torch.as_tensor(mask, dtype=torch.bool), -torch.inf).argmax())


def random_legal(rng: np.random.Generator, mask: np.ndarray) -> int:
    return int(rng.choice(np.flatnonzero(mask)))


def win_rate(q: nn.Module, seat: int, games: int, seed: int) -> float:
    """Share of ``games`` the greedy ``q`` wins from ``seat`` against random moves (bare env)."""
    env, rng, wins = tictactoe_v3.env(), np.random.default_rng(seed), 0
    me = env.possible_agents[seat]
    for game in range(games):
        env.reset(seed=seed + game)
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                wins += agent == me and reward > 0
                env.step(None)
            else:
                mask = obs["action_mask"].astype(bool)
                env.step(greedy(q, obs["observation"], mask) if agent == me else random_legal(rng, mask))
    return wins / games


def learn(
    q: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer, batch: fe.FlexiBatch, agent: str, gamma: float
) -> None:
    """One DQN step on ``agent``'s rows of a batch keyed by agent (`FlexiBatch.by_agent`, as
    AgileRL's learners read theirs); rows where that player did not move are skipped."""
    active = batch.active[agent][:, 0].bool()  # a value a row comes as a column [batch, 1]
    obs, obs_ = batch.obs[agent][active].view(-1, 18), batch.obs_[agent][active].view(-1, 18)
    action = batch.discrete_actions[agent][active][:, 0]
    reward = batch.individual_rewards[agent][active][:, 0]
    ended = batch.terminated[agent][active][:, 0] + batch.truncated[agent][active][:, 0]
    legal_next = batch.action_mask_[agent][0][active].bool()
    with torch.no_grad():
        next_value = target(obs_).masked_fill(~legal_next, -torch.inf).max(dim=1).values
        y = reward + gamma * torch.where(ended > 0, 0.0, next_value)
    loss = nn.functional.smooth_l1_loss(q(obs).gather(1, action[:, None])[:, 0], y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train(args: argparse.Namespace) -> tuple[list[nn.Module], list[tuple[int, float, float]]]:
    """Train both seats; returns the Q-networks and (game, win rate seat 1, seat 2) checkpoints."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    env = fe.record(tictactoe_v3.env(), num_steps=50_000, gamma=args.gamma, seed=args.seed)
    seats = list(env.possible_agents)
    qs, targets = [q_network() for _ in seats], [q_network() for _ in seats]
    optimizers = [torch.optim.Adam(q.parameters(), lr=args.lr) for q in qs]

    def win_rates() -> list[float]:  # the same seeds at every point of the curve
        return [win_rate(q, seat, args.curve_games, seed=10**6) for seat, q in enumerate(qs)]

    curve, updates = [(0, *win_rates())], 0
    for game in range(args.episodes):
        learner = seats[game % 2]
        epsilon = max(0.05, 1.0 - game / args.epsilon_games)
        env.reset(seed=args.seed + game)
        for agent in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            if terminated or truncated:
                env.step(None)
                continue
            mask = obs["action_mask"].astype(bool)
            explore = agent != learner or rng.random() < epsilon
            env.step(random_legal(rng, mask) if explore else greedy(qs[seats.index(agent)], obs["observation"], mask))
        if len(env.buffer) < 4 * args.batch_size:
            continue
        for seat, agent in enumerate(seats):
            batch = env.buffer.sample_transitions(args.batch_size, as_torch=True).by_agent()  # batch.obs[agent]
            learn(qs[seat], targets[seat], optimizers[seat], batch, agent, args.gamma)
        updates += 1
        if updates % args.target_every == 0:
            for q, target in zip(qs, targets):
                target.load_state_dict(q.state_dict())
        if (game + 1) % max(1, args.episodes // 10) == 0:
            curve.append((game + 1, *win_rates()))
    return qs, curve


def plot(curve: list[tuple[int, float, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games, first, second = zip(*curve)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(games, first, marker="o", label="moving first (player_1)")
    ax.plot(games, second, marker="o", label="moving second (player_2)")
    ax.set(
        xlabel="training games",
        ylabel="win rate against random moves",
        ylim=(0, 1),
        title="Independent DQN on tic-tac-toe, flexibuff_envs",
    )
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    before = [win_rate(q_network(), seat, args.eval_games, seed=args.seed + 1) for seat in (0, 1)]
    start = time.perf_counter()
    qs, curve = train(args)
    seconds = time.perf_counter() - start
    after = [win_rate(q, seat, args.eval_games, seed=args.seed + 1) for seat, q in enumerate(qs)]
    print(f"{args.episodes} games in {seconds:.0f} s; win rate against random moves over {args.eval_games} games:")
    for seat, name in enumerate(("moving first ", "moving second")):
        print(f"  {name}  before {before[seat]:.1%}  after {after[seat]:.1%}")
    if args.plot and curve:
        plot(curve, args.plot)
        print(f"win-rate curve: {args.plot}")


if __name__ == "__main__":
    main()
