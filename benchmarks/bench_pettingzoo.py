"""Recording overhead on PettingZoo: simple_spread_v3 parallel steps and connect_four_v3 AEC turns.

Bare and recorded envs take the same actions, back to back in each round; the median of the
rounds' ratios with the lowest and highest. Targets: at most 10%
added (ratio <= 1.10x). The parallel step is measured with and without the global state: with
it, every step also calls the env's own state(), which the bare loop never does. Two envs of
many agents (sisl's pursuit_v5, 8 pursuers, and multiwalker_v9 with 10 walkers) show what the
per-agent writes of a parallel step cost where agents are many.
Run: python benchmarks/bench_pettingzoo.py [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import flexibuff_envs as fe

warnings.filterwarnings("ignore")
from mpe2 import simple_spread_v3
from pettingzoo.classic import connect_four_v3
from pettingzoo.sisl import multiwalker_v9, pursuit_v5


def parallel_run(env: Any, actions: list[dict]) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for act in actions:
        if not env.agents:
            env.reset()
        env.step(act if len(act) == len(env.agents) else {a: act[a] for a in env.agents})
    return (time.perf_counter() - start) / len(actions) * 1e6


def aec_run(env: Any, turns: int) -> float:
    """Plays fixed-seed legal random moves; returns us per turn (last() + step())."""
    rng = np.random.default_rng(0)
    done = 0
    start = time.perf_counter()
    while done < turns:
        env.reset(seed=0)
        for _ in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            if terminated or truncated:
                action = None
            else:
                legal = np.flatnonzero(obs["action_mask"])
                action = int(legal[rng.integers(len(legal))])
            env.step(action)
            done += 1
    return (time.perf_counter() - start) / done * 1e6


def compare(name: str, unit: str, bare: Callable[[], float], recorded: Callable[[], float], rounds: int) -> None:
    """Bare and recorded back to back in each round, the first of the pair alternating; the
    median of the rounds' own ratios (a drift of the machine between rounds cancels), with the
    lowest and highest."""
    b, r = [], []
    for i in range(rounds):
        if i % 2:
            r.append(recorded())
            b.append(bare())
        else:
            b.append(bare())
            r.append(recorded())
    ratios = sorted(y / x for x, y in zip(b, r))
    print(
        f"{name}: bare {statistics.median(b):7.1f} us/{unit}, recorded {statistics.median(r):7.1f} us/{unit}, "
        f"ratio {statistics.median(ratios):5.3f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) (target <= 1.10x)"
    )


def random_actions(make: Callable[[], Any], steps: int) -> list[dict]:
    probe = make()
    probe.reset(seed=0)
    for agent in probe.possible_agents:
        probe.action_space(agent).seed(0)
    return [{a: probe.action_space(a).sample() for a in probe.possible_agents} for _ in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    actions = random_actions(simple_spread_v3.parallel_env, args.steps)
    bare_p = simple_spread_v3.parallel_env()
    for record_state in (True, False):
        rec_p = fe.record(simple_spread_v3.parallel_env(), num_steps=args.steps, record_state=record_state)
        compare(
            f"simple_spread_v3 parallel step, record_state={record_state}",
            "step",
            lambda: parallel_run(bare_p, actions),
            lambda rec_p=rec_p: parallel_run(rec_p, actions),
            args.rounds,
        )
    many: dict[str, Callable[[], Any]] = {
        "pursuit_v5 (8 pursuers)": lambda: pursuit_v5.parallel_env(max_cycles=200),
        "multiwalker_v9 (10 walkers)": lambda: multiwalker_v9.parallel_env(n_walkers=10, max_cycles=200),
    }
    for name, make in many.items():
        steps = args.steps // 10  # these envs step about 10x slower
        moves, bare, recorded = (
            random_actions(make, steps),
            make(),
            fe.record(make(), num_steps=steps, record_state=False),
        )
        compare(
            f"{name} parallel step",
            "step",
            lambda bare=bare, moves=moves: parallel_run(bare, moves),
            lambda recorded=recorded, moves=moves: parallel_run(recorded, moves),
            args.rounds,
        )
    bare_a, rec_a = connect_four_v3.env(), fe.record(connect_four_v3.env(), num_steps=args.steps)
    compare(
        "connect_four_v3 AEC turn",
        "turn",
        lambda: aec_run(bare_a, args.steps),
        lambda: aec_run(rec_a, args.steps),
        args.rounds,
    )


if __name__ == "__main__":
    main()
