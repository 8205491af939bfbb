"""What streaming every ended episode to an episode log costs, against the same loop in RAM only.

Side by side in one run, the same actions: CartPole-v1 recorded by `fe.record` with and without
``log=DIR`` (default fsync policy: every 5 s), with random actions (22-step episodes) and with a
policy that balances the pole (longer episodes), gymnasium's natively vectorized CartPole x64
(its ended episodes logged with the recorder's blocks of steps, the stage in a file of the log;
with a ring as long as the run, so every row is written for the first time, and with a ring an
eighth of it, which wraps as a long recording's does), and PettingZoo's connect_four_v3 (AEC).

A loop is long (400,000 env steps, 3.2 million sub-env steps for the vector env: about ten
seconds), so that it spans several of the log's 5-second intervals, each with its fold and its
sync (on a thread of its own) as in a long recording, and it ends with ``sync_log()``, timed
(nothing without a log): the episodes its log holds folded into the columns and synced. (A
one-second loop would time the close's fold and sync and none of the periodic ones: what ends a
recording, spread over one second of it.) In each round the two recorders run at once, taking
turns a chunk of steps at a time (which goes first alternates): a host whose speed drifts, as a
shared one does by tens of percent within seconds, slows both alike. Prints, per env step (per sub-env step for the vector env, per turn
for AEC), the medians over the rounds in microseconds, the median of the rounds' ratios (logged
/ RAM only) with the lowest and highest, and what the log adds to each ended episode (the
median difference times the steps per episode).
Run: python benchmarks/bench_log.py [--steps N] [--rounds R] [--only NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import CHUNK, aec, chunks, single  # the loops, taking turns a chunk at a time

#: a case's loop: makes its recorder at the first ``next``, then runs ``CHUNK`` steps per
#: ``next``, then returns the episodes that ended
Loop = Generator[None, None, int]


def cartpole(log: str | None, steps: int) -> Loop:
    env = fe.record(gym.make("CartPole-v1"), num_steps=steps, log=log)
    yield  # made: not timed
    yield from single(env, np.random.default_rng(0).integers(0, 2, steps).tolist())
    env.buffer.sync_log()  # the log's episodes folded into its columns and synced, timed: part of its cost
    yield
    env.close()
    return env.buffer.n_episodes


def balanced(log: str | None, steps: int) -> Loop:
    """CartPole with a policy that balances the pole (episodes of about 200-500 steps): what an
    episode's append costs spread over a longer episode."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=steps, log=log)
    yield  # made: not timed
    obs, _ = env.reset(seed=0)
    for chunk in chunks(steps):
        for _ in chunk:
            obs, _, terminated, truncated, _ = env.step(int(obs[2] + 0.5 * obs[3] > 0))
            if terminated or truncated:
                obs, _ = env.reset()
        yield
    env.buffer.sync_log()  # the log's episodes folded into its columns and synced, timed: part of its cost
    yield
    env.close()
    return env.buffer.n_episodes


def vector(log: str | None, steps: int, n: int = 64, wrapping: bool = False) -> Loop:
    """``wrapping``: a ring of an eighth of the run's steps (else all of them)."""
    venv = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(venv), num_steps=steps // n // (8 if wrapping else 1) + 1)
    if log is not None:
        buffer.log_to(log)
    env = fe.record(venv, buffer)
    actions = np.random.default_rng(0).integers(0, 2, (steps // n, n))
    yield  # made: not timed
    env.reset(seed=0)
    ended = 0
    for chunk in chunks(len(actions)):
        for j in chunk:
            ended += int(np.count_nonzero(env.step(actions[j])[2]))  # CartPole ends by terminating (500 steps: never)
        yield
    len(env.buffer)  # the last block written, as any read does
    yield
    env.buffer.sync_log()  # the log's episodes folded into its columns and synced, timed: part of its cost
    yield
    env.close()
    return ended  # a wrapping ring holds only its newest episodes


def connect_four(log: str | None, steps: int) -> Loop:
    """Random legal moves, a turn per step."""
    from pettingzoo.classic import connect_four_v3

    env = fe.record(connect_four_v3.env(), num_steps=steps, log=log)
    yield  # made: not timed
    yield from aec(env, np.random.default_rng(0).random(steps).tolist())
    env.buffer.sync_log()  # the log's episodes folded into its columns and synced, timed: part of its cost
    yield
    env.close()
    return env.buffer.n_episodes


def side_by_side(case: Callable[[str | None, int], Loop], steps: int, directory: str) -> tuple[float, float, int]:
    """Seconds the loop spent in RAM only and with a log in ``directory``, taking turns, and the
    episodes that ended."""
    loops = [case(None, steps), case(directory, steps)]
    for loop in loops:  # each makes its recorder (and the log), untimed
        next(loop)
    spent = [0.0, 0.0]
    episodes: list[int | None] = [None, None]
    turn = 0
    while None in episodes:
        for k in (0, 1) if turn % 2 == 0 else (1, 0):
            if episodes[k] is not None:
                continue
            start = time.perf_counter()
            try:
                next(loops[k])
            except StopIteration as done:  # closed, not timed
                episodes[k] = done.value
                continue
            spent[k] += time.perf_counter() - start
        turn += 1
    return spent[0], spent[1], int(episodes[1] or 0)


def compare(name: str, case: Callable[[str | None, int], Loop], steps: int, rounds: int) -> None:
    ram: list[float] = []
    logged: list[float] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as directory:
            a, b, episodes = side_by_side(case, steps, directory)
        ram.append(a / steps * 1e6)
        logged.append(b / steps * 1e6)
    ratios = sorted(b / a for a, b in zip(ram, logged))
    added = statistics.median(b - a for a, b in zip(ram, logged)) * steps / max(episodes, 1)
    print(
        f"  {name:<36} RAM only {statistics.median(ram):7.2f} us   with log {statistics.median(logged):7.2f} us   "
        f"{statistics.median(ratios):5.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})  (target <= 1.10x)"
        f"   {steps / max(episodes, 1):6.1f} steps/episode, the log adds {added:5.0f} us an episode"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = parser.parse_args()
    print(
        f"recording with an episode log against RAM only, {args.steps} steps x {args.rounds} rounds, "
        f"the two loops taking turns every {CHUNK} steps (medians; lowest-highest ratio)"
    )
    cases: list[tuple[str, Callable[[Any, int], Loop], int]] = [
        ("CartPole-v1", cartpole, args.steps),
        ("CartPole-v1, a balancing policy", balanced, args.steps),
        ("CartPole-v1 x64, native vector", vector, args.steps * 8),
        ("  the same, its ring wrapping", lambda log, steps: vector(log, steps, wrapping=True), args.steps * 8),
        ("connect_four_v3 (AEC)", connect_four, args.steps // 5),
    ]
    for name, measure, steps in cases:
        if args.only in name:
            compare(name, measure, steps, args.rounds)


if __name__ == "__main__":
    main()
