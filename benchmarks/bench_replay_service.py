"""The sharded replay service against one in-process buffer and TorchRL's RayReplayBuffer, in one
run: rows inserted a second and batches sampled a second.

``--rows`` rows of CartPole (random actions, seed 0) are recorded once, then inserted in pieces of
whole episodes of about ``--piece`` rows into: one `FlexibleBuffer` in this process (`extend`);
a `ReplayService` of 1, 2 and 4 shards (`insert` from the learner, the pieces spread over the
shards); TorchRL's `RayReplayBuffer` (one actor, a `LazyTensorStorage`, the same rows as a
TensorDict of obs, action, reward, next obs, done). Then batches of ``--batch`` rows are drawn,
uniformly and prioritized (alpha 0.6, beta 0.4): `sample_transitions`, `ReplayService.sample`
(one call at a time), TorchRL's `sample` (uniform only: its prioritized sampler needs a C++
extension this build lacks). Then a learner that steps ``--step`` ms after each batch (a sleep:
a step on a GPU leaves the CPU and the GIL) takes batches from `ReplayService.sample`, and from
`ReplayService.stream` (4 drawn ahead on a thread while it steps).
Ray runs on this machine (``ray.init(num_cpus=4)``): every actor is a process here, so a call
is a round trip between processes of the same two cores. Medians of ``--rounds``.

Run: python benchmarks/bench_replay_service.py
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import statistics
import time
from collections.abc import Callable, Iterable

import gymnasium as gym
import numpy as np
from stamp import commit, machine

import flexibuff_envs as fe


def recorded(rows: int) -> fe.FlexibleBuffer:
    env = fe.record(gym.make("CartPole-v1"), num_steps=rows + 600)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(rows):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    return env.buffer


def pieces(buffer: fe.FlexibleBuffer, rows: int) -> list[fe.Chunk]:
    chunk = buffer.copy_episodes()
    ends = np.cumsum(chunk.lengths)
    cuts = [0, *np.searchsorted(ends, np.arange(rows, ends[-1], rows), side="right").tolist(), chunk.n_episodes]
    return [chunk[a:b] for a, b in itertools.pairwise(sorted(set(cuts))) if b > a]


def timed(run: Callable[[], object], rounds: int) -> float:
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def torchrl_buffer(capacity: int, batch: int) -> object:
    """TorchRL's replay buffer on one Ray actor, sampling uniformly."""
    from torchrl.data import LazyTensorStorage, RandomSampler
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

    return RayReplayBuffer(
        storage=functools.partial(LazyTensorStorage, capacity),
        sampler=RandomSampler,  # named: its default reaches for a C++ sum tree this build lacks
        batch_size=batch,
        remote_config={"num_cpus": 0.01},
    )


def as_tensordict(batch: fe.FlexiBatch) -> object:
    import torch
    from tensordict import TensorDict

    return TensorDict(
        {
            "obs": torch.as_tensor(batch.obs),
            "action": torch.as_tensor(batch.discrete_actions),
            "reward": torch.as_tensor(batch.individual_rewards),
            "next_obs": torch.as_tensor(batch.obs_),
            "done": torch.as_tensor(batch.terminated),
        },
        batch_size=[len(batch.idx)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="rows recorded and inserted")
    parser.add_argument("--piece", type=int, default=5_000, help="rows of each insert")
    parser.add_argument("--batch", type=int, default=256, help="rows of each sample")
    parser.add_argument("--samples", type=int, default=500, help="samples timed each round")
    parser.add_argument("--step", type=float, default=2.0, help="ms of a learner's step between samples")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import ray

    from flexibuff_envs.integrations.ray_replay import ReplayService

    print(f"the replay service: {machine()}, commit {commit()}, seed 0, medians of {args.rounds}")
    source = recorded(args.rows)
    parts = pieces(source, args.piece)
    rows = sum(p.rows for p in parts)
    print(f"{rows:,} CartPole rows in {len(parts)} inserts of whole episodes; batches of {args.batch}")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    capacity = 2 * rows
    results: dict[str, tuple[float, float, float]] = {}  # name -> rows/s inserted, uniform and prioritized batches/s
    learning: dict[str, tuple[float, float]] = {}  # name -> prioritized batches/s with a learner step: sample, stream

    def local_buffer() -> fe.FlexibleBuffer:
        return fe.FlexibleBuffer.from_spec(source.spec, num_steps=capacity, alpha=0.6)

    held = local_buffer()
    inserting = timed(lambda: [local_buffer().extend(p) for p in parts], args.rounds)
    for p in parts:
        held.extend(p)
    uniform = timed(lambda: [held.sample_transitions(args.batch) for _ in range(args.samples)], args.rounds)
    prioritized = timed(
        lambda: [held.sample_transitions(args.batch, prioritized=True) for _ in range(args.samples)], args.rounds
    )
    results["one buffer, in process"] = (rows / inserting, args.samples / uniform, args.samples / prioritized)

    for shards in (1, 2, 4):
        seconds = []
        for _ in range(args.rounds):
            service = ReplayService(source.spec, shards=shards, capacity=capacity, alpha=0.6)
            began = time.perf_counter()
            for p in parts:
                service.insert(p)
            seconds.append(time.perf_counter() - began)
            if len(seconds) < args.rounds:
                service.close()
        inserting = statistics.median(seconds)
        uniform = timed(lambda service=service: [service.sample(args.batch) for _ in range(args.samples)], args.rounds)
        prioritized = timed(
            lambda service=service: [service.sample(args.batch, prioritized=True) for _ in range(args.samples)],
            args.rounds,
        )

        def learner(batches: Iterable[object]) -> None:
            for _ in batches:
                time.sleep(args.step / 1000)  # a training step that leaves the GIL (a GPU's, say)

        stepped = (
            timed(
                lambda service=service: learner(
                    service.sample(args.batch, prioritized=True) for _ in range(args.samples)
                ),
                args.rounds,
            ),
            timed(
                lambda service=service: learner(
                    itertools.islice(service.stream(args.batch, depth=4, prioritized=True), args.samples)
                ),
                args.rounds,
            ),
        )
        service.close()
        name = f"service, {shards} shard{'s' * (shards > 1)}"
        results[name] = (rows / inserting, args.samples / uniform, args.samples / prioritized)
        learning[name] = (args.samples / stepped[0], args.samples / stepped[1])

    if importlib.util.find_spec("torchrl") is not None:
        starts = np.cumsum([0] + [p.rows for p in parts[:-1]])
        tensors = [as_tensordict(held.gather(np.arange(a, a + p.rows))) for a, p in zip(starts, parts)]
        rb = torchrl_buffer(capacity, args.batch)
        began = time.perf_counter()
        for td in tensors:
            rb.extend(td)  # type: ignore[attr-defined]
        inserted = rows / (time.perf_counter() - began)
        uniform = timed(lambda: [rb.sample() for _ in range(args.samples)], args.rounds)  # type: ignore[attr-defined]
        rb.shutdown()  # type: ignore[attr-defined]
        results["TorchRL RayReplayBuffer (one actor)"] = (inserted, args.samples / uniform, float("nan"))
        print(
            "TorchRL's PrioritizedSampler needs its C++ sum tree, which this torchrl build lacks "
            "(SumSegmentTreeFp32 is not available): its prioritized column is left empty"
        )
    else:
        print("TorchRL is not installed: its RayReplayBuffer is left out")

    base = results["one buffer, in process"]
    print("\n| replay | rows inserted/s | uniform batches/s | prioritized batches/s |")
    print("|---|---|---|---|")
    for name, (ins, uni, pri) in results.items():
        cells = [
            "" if np.isnan(value) else f"{value:,.0f} ({value / ref:.2f}x)" for value, ref in zip((ins, uni, pri), base)
        ]
        print(f"| {name} | {' | '.join(cells)} |")
    print(
        f"\nprioritized batches a second with a learner step of {args.step:g} ms after each (its ceiling {1000 / args.step:,.0f}):\n"
    )
    print("| replay | sample, then step | stream(depth=4): drawn while stepping |")
    print("|---|---|---|")
    for name, (one, ahead) in learning.items():
        print(f"| {name} | {one:,.0f} | {ahead:,.0f} ({ahead / one:.2f}x) |")
    ray.shutdown()


if __name__ == "__main__":
    main()
