"""Collection throughput on Ray workers against one process, and what merging costs.

simple_spread_v3 (the MPE env, a slow step) with random actions: one process recording with its
recorder, against `RayCollector` with N workers on a local Ray instance, in interleaved rounds;
medians of per-round ratios. N plain processes stepping the same loop with no Ray show what the
machine itself gives. Targets (2 workers on a 2-core machine): at least 1.6x the one-process steps/s, and the
learner's merging under 5% of the collection time. Also prints what crosses to the learner.
Run: python benchmarks/bench_distributed.py [--workers N] [--rounds R] [--steps S] [--chunk C]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
import warnings
from itertools import accumulate, takewhile

warnings.filterwarnings("ignore")
import numpy as np
import ray
from mpe2 import simple_spread_v3

import flexibuff_envs as fe
from flexibuff_envs.integrations.ray import RayCollector
from flexibuff_envs.recording.rollout import steps


def make_env() -> object:
    return simple_spread_v3.parallel_env()


def one_process(n: int, seed: int) -> float:
    """Steps per second of one recorded env stepped ``n`` times (the workers' loop, in process)."""
    env = fe.record(make_env(), num_steps=n + 1000)
    played = steps(env, "parallel", seed=seed)
    start = time.perf_counter()
    for _ in takewhile(lambda total: total < n, accumulate(stepped for stepped, _ in played)):
        pass
    return n / (time.perf_counter() - start)


@ray.remote(num_cpus=0)
class Replay:
    """A worker that steps nothing: it hands back the same chunk, to find the learner's ceiling."""

    def __init__(self, chunk: fe.Chunk) -> None:
        self.chunk = chunk

    def collect(self, n: int) -> fe.Chunk:
        return self.chunk


def frames_chunk(rows: int) -> fe.Chunk:
    """Episodes of 84x84x4 uint8 frames (Atari-sized rows), filled by hand."""
    buffer = fe.FlexibleBuffer(
        rows + 1, obs_size=84 * 84 * 4, obs_dtype="uint8", discrete_action_cardinalities=[6], individual_reward=True
    )
    frames = np.random.default_rng(0).integers(0, 256, (rows + 1, 84 * 84 * 4), dtype=np.uint8)
    for start in range(0, rows, 100):
        buffer.begin_episode()
        for t in range(start, start + 100):
            row = buffer.claim_row()
            buffer.field("obs")[0, row] = frames[t]
            buffer.field("obs_")[0, row] = frames[t + 1]
            buffer.field("terminated")[0, row] = t == start + 99
        buffer.end_episode()
    return buffer.take_episodes()


def bytes_a_step() -> dict[str, float]:
    """``Chunk.nbytes / Chunk.rows`` of 2,000 steps of random legal actions, per env kind."""
    import gymnasium as gym
    from pettingzoo.classic import connect_four_v3

    envs = {
        "CartPole-v1": gym.make("CartPole-v1"),
        "connect_four_v3 (AEC, masks; a row is both players' turn)": connect_four_v3.env(),
        "simple_spread_v3 (3 agents, with state)": make_env(),
    }
    out = {}
    for name, env in envs.items():
        buffer = fe.warm(env, steps=2000, seed=0, progress=False, num_steps=4000)
        chunk = buffer.take_episodes()
        out[name] = chunk.nbytes / chunk.rows
    frames = frames_chunk(2000)
    out["84x84x4 uint8 frames"] = frames.nbytes / frames.rows
    return out


def ceiling(chunk: fe.Chunk, seconds: float = 3.0) -> tuple[float, float]:
    """Steps/s and MB/s the learner takes in (fetch + merge) from 2 workers that only send ``chunk``."""
    learner = fe.FlexibleBuffer.from_spec(
        chunk.spec, num_steps=4 * chunk.rows, global_reward=False, individual_reward=False
    )
    workers = [Replay.remote(chunk) for _ in range(2)]
    pending = {w.collect.remote(0): w for w in workers for _ in range(2)}
    merged, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        worker = pending.pop(ref)
        learner.extend(ray.get(ref))
        merged += 1
        pending[worker.collect.remote(0)] = worker
    elapsed = time.perf_counter() - start
    for w in workers:
        ray.kill(w)
    return merged * chunk.rows / elapsed, merged * chunk.nbytes / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=6000, help="env steps per round, in all")
    parser.add_argument("--chunk", type=int, default=1000, help="env steps per chunk a worker sends")
    args = parser.parse_args()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    collector = RayCollector(
        make_env, n_workers=args.workers, chunk_steps=args.chunk, num_steps=args.steps * (args.rounds + 1)
    )
    collector.collect(args.steps)  # warm-up: workers import and reset their envs
    alone, spread, plain, merged, sizes = [], [], [], [], []
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        share = args.steps // args.workers
        pool.starmap(one_process, [(100, i) for i in range(args.workers)])  # warm-up: imports
        for r in range(args.rounds):  # each round side by side: the machine is shared and noisy
            alone.append(one_process(share, seed=r))
            plain.append(sum(pool.starmap(one_process, [(share, r + i) for i in range(args.workers)])))
            run = collector.collect(args.steps)
            spread.append(run.steps / run.seconds)
            merged.append(run.merge_seconds / run.seconds)
            sizes += [(c.nbytes, c.rows) for c in run.chunks]
    worker = fe.record(make_env(), num_steps=2 * args.chunk)
    for _ in takewhile(lambda total: total < args.chunk, accumulate(n for n, _ in steps(worker, "parallel", seed=0))):
        pass
    spread_chunk = worker.buffer.take_episodes()
    intake = {"simple_spread_v3": ceiling(spread_chunk), "84x84x4 frames": ceiling(frames_chunk(args.chunk))}
    collector.close()
    ray.shutdown()
    one, many = statistics.median(alone), statistics.median(spread)
    nbytes, rows = sum(b for b, _ in sizes), sum(r for _, r in sizes)
    print(f"simple_spread_v3, {args.workers} workers, chunks of {args.chunk} steps, {args.rounds} rounds (medians)")
    print(f"  one process:      {one:8,.0f} steps/s ({1e6 / one:.0f} us a step)")
    print(
        f"  {args.workers} plain processes: {statistics.median(plain):8,.0f} steps/s = "
        f"{statistics.median(p / a for p, a in zip(plain, alone)):.2f}x one process (what the machine gives)"
    )
    print(
        f"  {args.workers} Ray workers:     {many:8,.0f} steps/s = "
        f"{statistics.median(s / a for s, a in zip(spread, alone)):.2f}x one process (target >= 1.6x), "
        f"{statistics.median(s / p for s, p in zip(spread, plain)):.2f}x the plain processes"
    )
    print(f"  merging:      {100 * statistics.median(merged):.2f}% of the collection time (target < 5%)")
    print(
        f"  to the learner: {nbytes / rows:,.0f} bytes a step, {nbytes / len(sizes) / 1e6:.2f} MB a chunk, "
        f"{many * nbytes / rows / 1e6:.2f} MB/s"
    )
    print(f"learner intake ceiling (fetch + merge of chunks of {args.chunk} steps from workers that only send):")
    for name, (steps_per_s, mb_per_s) in intake.items():
        print(
            f"  {name:17} {steps_per_s:10,.0f} steps/s, {mb_per_s:7,.0f} MB/s "
            f"= {steps_per_s / (many / args.workers):,.0f} workers at the measured rate per worker"
        )
    print("bytes a step of what arrives (Chunk.nbytes / Chunk.rows, 2,000 steps of random legal actions, seed 0):")
    for name, per_step in bytes_a_step().items():
        print(
            f"  {name:58} {per_step:9,.0f} B; a network into the learner of 1 Gb/s carries "
            f"{125e6 / per_step:10,.0f} steps/s, 10 Gb/s {1250e6 / per_step:11,.0f}"
        )


if __name__ == "__main__":
    main()
