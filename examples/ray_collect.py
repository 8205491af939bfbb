"""Collect mpe2 simple_spread_v3 on 2 Ray workers into one buffer while the learner trains.

Each worker builds the env, records it and acts with a copy of a small torch actor (one network
shared by the three agents). First a synchronous `collect`, then a `stream` of chunks: after
each chunk the learner takes a policy-gradient step on a sampled batch (returns ``G`` come from
the workers) and broadcasts the new weights with `set_weights`. Nothing per step crosses
between processes: whole episodes arrive in chunks.

On a cluster, start Ray on the machines and pass its address (see docs/scaling.md).
Run: python examples/ray_collect.py [--steps 20000] [--chunks 20] [--address auto]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import ray
import torch
from mpe2 import simple_spread_v3

from flexibuff_envs.integrations.ray import RayCollector


def make_env() -> Any:
    return simple_spread_v3.parallel_env()


class Actor(torch.nn.Module):
    """One policy for every agent: 18 observed values in, 5 action logits out."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(18, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))

    def forward(self, observations: dict[str, np.ndarray], infos: dict) -> dict[str, int]:
        """What a worker calls: an action for each agent, sampled from its logits."""
        agents = list(observations)
        logits = self.net(torch.as_tensor(np.stack([observations[a] for a in agents])))
        return dict(zip(agents, torch.distributions.Categorical(logits=logits).sample().tolist()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps of the synchronous collect")
    parser.add_argument("--chunks", type=int, default=20, help="chunks to train on while streaming")
    parser.add_argument("--chunk-steps", type=int, default=1000, help="env steps per chunk a worker sends")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per policy-gradient step")
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start one here)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ray.init(
        address=args.address, **({} if args.address else {"num_cpus": 2}), include_dashboard=False, log_to_driver=False
    )
    actor = Actor()
    optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
    collector = RayCollector(make_env, actor, n_workers=2, seed=0, chunk_steps=args.chunk_steps, num_steps=200_000)
    try:
        run = collector.collect(args.steps)
        print(
            f"collected {run.steps:,} steps ({run.episodes:,} episodes) in {run.seconds:.2f} s on 2 workers: "
            f"{run.steps / run.seconds:,.0f} steps/s, {run.nbytes / run.steps:,.0f} bytes a step to the learner, "
            f"merging took {1000 * run.merge_seconds:.1f} ms"
        )
        start, trained = time.perf_counter(), 0
        for info in collector.stream():
            batch = collector.buffer.sample_transitions(args.batch_size, as_torch=True)
            logits = actor.net(batch.obs)  # [agents, batch, 5]
            chosen = torch.log_softmax(logits, -1).gather(-1, batch.discrete_actions).squeeze(-1)
            returns = (batch.G - batch.G.mean()) / (batch.G.std() + 1e-8)
            loss = -(chosen * returns).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            version = collector.set_weights(actor.state_dict())
            trained += 1
            if trained == args.chunks:
                break
        buffer = collector.buffer
        print(
            f"streamed and trained on {trained} chunks in {time.perf_counter() - start:.2f} s; the last chunk "
            f"came from worker {info.worker} acting with weights version {info.weights_version} of {version}"
        )
        print(
            f"buffer: {len(buffer):,} rows, {buffer.n_episodes:,} whole episodes, "
            f"mean return {buffer.episode_stats()['returns'].mean():.1f} per agent"
        )
    finally:
        collector.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
