"""`verify --replay` against the env's own stepping: the time `replay` takes to replay and check
a log, over the time a bare loop takes to step a fresh env through the same seeds and actions,
in one run.

Each env is recorded with random actions (action spaces seeded 0), its first reset seeded 0 and
the others going on from it, for ``--steps`` steps, into a log; the bare loop makes the env the
same way (`gym.make` of its id; the PettingZoo module's factory), resets it with the same seeds
and steps the same actions, already decoded; `replay` opens the log, replays it and compares
every row. Medians of ``--rounds``.

Run: python benchmarks/bench_replay.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
from stamp import commit, machine  # beside this script

import flexibuff_envs as fe
from flexibuff_envs.integrations.replay import replay
from flexibuff_envs.spec.actions import actions_of


def gym_case(name: str) -> tuple[Callable[[], Any], str]:
    return (lambda: gym.make(name)), "gym"


def record(make: Callable[[], Any], kind: str, steps: int, log: Path) -> None:
    made = {} if kind == "gym" else {"env_kwargs": {}}  # a PettingZoo env's keywords: made with none
    env = fe.record(make(), num_steps=1 << 16, log=log, **made)
    done = 0
    if kind == "gym":
        env.action_space.seed(0)
        env.reset(seed=0)
        while done < steps:
            done += 1
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()
    elif kind == "parallel":
        for k, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(k)
        env.reset(seed=0)
        while done < steps:
            done += 1
            env.step({agent: env.action_space(agent).sample() for agent in env.agents})
            if not env.agents:
                env.reset()
    else:
        for k, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(k)
        env.reset(seed=0)
        while done < steps:
            for agent in env.agent_iter():
                obs, _, terminated, truncated, _ = env.last()
                mask = obs["action_mask"] if isinstance(obs, dict) else None
                env.step(None if terminated or truncated else env.action_space(agent).sample(mask))
                done += 1
            env.reset()
    env.close()


def bare(make: Callable[[], Any], kind: str, log: Path) -> Callable[[], None]:
    """A loop stepping a fresh env through the log's seeds and actions (decoded beforehand)."""
    buffer = fe.FlexibleBuffer.open(log)
    seeds = buffer.episode_origins()["seed"].tolist()
    probe = make()
    agents = list(buffer.spec.agent_ids)
    space = (lambda a: probe.action_space) if kind == "gym" else probe.action_space
    episodes = []
    for batch in buffer.episodes():
        d, c = batch.discrete_actions, batch.continuous_actions
        if kind == "gym":
            episodes.append(actions_of(space(None), d, c))
        else:
            episodes.append(
                {
                    a: actions_of(space(a), None if d is None else d[i], None if c is None else c[i])
                    for i, a in enumerate(agents)
                }
            )
    probe.close()

    def run() -> None:
        env = make()
        for seed, actions in zip(seeds, episodes):
            if kind == "gym":
                env.reset(seed=seed if seed >= 0 else None)
                for action in actions:
                    if any(env.step(action)[2:4]):
                        break
            elif kind == "parallel":
                env.reset(seed=seed if seed >= 0 else None)
                for t in range(len(actions[agents[0]])):
                    env.step({a: actions[a][t] for a in env.agents})
                    if not env.agents:
                        break
            else:
                env.reset(seed=seed if seed >= 0 else None)
                turns = dict.fromkeys(agents, 0)
                for agent in env.agent_iter():
                    _, _, terminated, truncated, _ = env.last(observe=False)
                    if terminated or truncated:
                        env.step(None)
                        continue
                    env.step(actions[agent][turns[agent]])
                    turns[agent] += 1
        env.close()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from mpe2 import simple_spread_v3
    from pettingzoo.classic import connect_four_v3

    cases: list[tuple[str, Callable[[], Any], str]] = [
        ("CartPole-v1 (4 us a step)", *gym_case("CartPole-v1")),
        ("Pendulum-v1", *gym_case("Pendulum-v1")),
        ("LunarLander-v3 (box2d)", *gym_case("LunarLander-v3")),
        ("simple_spread_v3 (parallel, 3 agents)", simple_spread_v3.parallel_env, "parallel"),
        ("connect_four_v3 (AEC)", connect_four_v3.env, "aec"),
    ]
    print(f"verify --replay against stepping the env: {machine()}, commit {commit()}, seed 0, medians of {args.rounds}")
    root = Path(tempfile.mkdtemp(prefix="flexibuff-bench-replay-"))
    try:
        for name, make, kind in cases:
            log = root / name.split()[0]
            record(make, kind, args.steps, log)
            run = bare(make, kind, log)
            report = replay(log)
            if not report.ok or len(report.clean) != fe.FlexibleBuffer.open(log).n_episodes:
                raise SystemExit(
                    f"{name}: not every episode replayed clean: {report.divergences[:1]}, {len(report.skipped)} skipped"
                )
            times = {"bare": [], "replay": []}
            for _ in range(args.rounds):
                start = time.perf_counter()
                run()
                times["bare"].append(time.perf_counter() - start)
                start = time.perf_counter()
                replay(log)
                times["replay"].append(time.perf_counter() - start)
            b, r = statistics.median(times["bare"]), statistics.median(times["replay"])
            episodes = len(report.clean)
            print(f"  {name:<38} {episodes:6,} episodes  env alone {b:6.2f} s  replay {r:6.2f} s  {r / b:5.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
