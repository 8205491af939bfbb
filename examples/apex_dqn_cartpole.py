"""Ape-X-style DQN on CartPole-v1: collectors on Ray actors insert straight into a sharded replay
service; one learner samples it. The same Double DQN, prioritized replay and 3-step returns as
examples/dqn_per_cartpole.py, spread over processes:

- ``--collectors`` Ray actors (`RayCollector`) each step a recorded CartPole with an
  epsilon-greedy copy of the Q network and insert every chunk of ended episodes into their
  shard of the `ReplayService` themselves (never through the learner);
- ``--shards`` shard actors hold the replay, each logging to its own episode log;
- the learner samples 64 rows at a time over every shard (prioritized, with importance weights
  over the whole replay), updates, and sends the TD errors back as priorities. Every 50 updates
  it sends the network and the exploration rate to the collectors.

The rate limiter holds 64 sampled rows per inserted row (one update per env step, as the
single-process example does) within a tolerance of 200 updates, and holds sampling back until
``--learning-starts`` rows are in: so the learning per env step matches the single-process loop,
whatever the speed of either side. It stops when the mean return of the last 20 episodes reaches
475 (solved), or at the step budget.

Run: python examples/apex_dqn_cartpole.py [--seeds 0 1 2] [--steps 60000] [--collectors 2] [--shards 2]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import tempfile
import time

import gymnasium as gym
import numpy as np
import ray
import torch
from torch import nn

import flexibuff_envs as fe
from flexibuff_envs.integrations.ray import RayCollector
from flexibuff_envs.integrations.ray_replay import RateLimiter, ReplayService

FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "discounts")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed")
    parser.add_argument("--steps", type=int, default=60_000, help="env steps per run at most (all collectors)")
    parser.add_argument("--collectors", type=int, default=2, help="Ray actors stepping envs")
    parser.add_argument("--shards", type=int, default=2, help="Ray actors holding the replay")
    parser.add_argument("--chunk-steps", type=int, default=50, help="env steps per chunk a collector inserts")
    parser.add_argument("--n-step", type=int, default=3, help="steps summed in each return")
    parser.add_argument("--alpha", type=float, default=0.6, help="prioritization exponent")
    parser.add_argument("--beta", type=float, default=0.4, help="importance-sampling exponent at the start")
    parser.add_argument("--gamma", type=float, default=0.99, help="discount")
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam step size")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per update")
    parser.add_argument("--learning-starts", type=int, default=1_000, help="rows in the replay before updates")
    parser.add_argument("--target-every", type=int, default=500, help="updates between target network copies")
    parser.add_argument("--explore-steps", type=int, default=10_000, help="env steps over which epsilon falls to 0.01")
    parser.add_argument("--target-return", type=float, default=475.0, help="solved at this mean of the last 20")
    return parser.parse_args(argv)


class EpsilonGreedy(nn.Module):
    """The collectors' policy: the Q network's greedy action, or a random one with probability
    ``epsilon`` (a buffer: the learner sends it with the weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
        self.register_buffer("epsilon", torch.tensor(1.0))

    def forward(self, obs: np.ndarray, info: dict) -> int:
        if float(torch.rand(())) < float(self.epsilon):
            return int(torch.randint(2, ()))
        return int(self.q(torch.as_tensor(obs)).argmax())


def train(args: argparse.Namespace, seed: int, log_dir: str) -> tuple[list[float], int | None, float]:
    """One run; returns each episode's return (in the order they reached the learner), the env
    step it was solved at and the rows sampled per row inserted."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    policy = EpsilonGreedy()
    q, target = policy.q, copy.deepcopy(policy.q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.lr)
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    per_insert = float(args.batch_size)
    service = ReplayService(
        spec,
        shards=args.shards,
        capacity=args.steps,
        log_dir=log_dir,
        alpha=args.alpha,
        gamma=args.gamma,
        seed=seed,
        limiter=RateLimiter(
            min_size=args.learning_starts,
            samples_per_insert=per_insert,
            tolerance=200 * args.batch_size,
        ),
    )
    collector = RayCollector(
        lambda: gym.make("CartPole-v1"),
        policy,
        n_workers=args.collectors,
        seed=seed * 100,
        chunk_steps=args.chunk_steps,
        service=service,
        recorder_options={"gamma": args.gamma},
    )
    returns: list[float] = []
    solved, steps, updates, inserted = None, 0, 0, 0
    try:
        collector.start()
        while steps < args.steps and solved is None:  # a stream of batches for each beta, drawn ahead
            beta = args.beta + (1.0 - args.beta) * min(1.0, inserted / args.steps)
            stream = service.stream(
                args.batch_size, prioritized=True, beta=beta, n_step=args.n_step, as_torch=True, fields=FIELDS
            )
            for batch in itertools.islice(stream, 1000):
                with torch.no_grad():  # Double DQN: the online net picks the action, the target net values it
                    best = q(batch.obs_).argmax(dim=1, keepdim=True)
                    bootstrap = target(batch.obs_).gather(1, best).squeeze(1)
                    y = batch.individual_rewards + batch.discounts * (1.0 - batch.terminated) * bootstrap
                taken = q(batch.obs).gather(1, batch.discrete_actions).squeeze(1)
                loss = (batch.weights * nn.functional.smooth_l1_loss(taken, y, reduction="none")).mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q.parameters(), 10.0)
                optimizer.step()
                service.update_priorities(batch.idx, (y - taken).abs().detach() + 1e-6)
                updates += 1
                if updates % args.target_every == 0:
                    target.load_state_dict(q.state_dict())
                if updates % 50 == 0:
                    inserted = service.counts()[0]
                    policy.epsilon.fill_(max(0.01, 1.0 - inserted / args.explore_steps))
                    collector.set_weights(policy.state_dict())
                    for info in collector.poll():
                        steps += info.steps
                        returns += info.returns[:, 0].tolist()
                    if len(returns) >= 20 and np.mean(returns[-20:]) >= args.target_return:
                        solved = steps
                    if steps >= args.steps or solved is not None:
                        break
            stream.close()
        collector.stop(timeout=5)
        inserted, sampled = service.counts()
    finally:
        collector.close()
        service.close()
    return returns, solved, sampled / max(inserted, 1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # a Ray of its own on this machine; on a cluster: ray.init(address="auto") (docs/guides/ray.md)
    ray.init(address="local", num_cpus=args.collectors + 1, include_dashboard=False, log_to_driver=False)
    try:
        for seed in args.seeds:
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as log_dir:
                returns, solved, ratio = train(args, seed, log_dir)
            last = np.mean(returns[-20:]) if returns else 0.0
            outcome = f"solved at step {solved}" if solved is not None else f"not solved in {args.steps} steps"
            print(
                f"seed {seed}: {outcome}; {len(returns)} episodes, mean return of the last 20: {last:.1f}; "
                f"{ratio:.1f} rows sampled per row inserted ({time.perf_counter() - start:.0f} s)"
            )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
