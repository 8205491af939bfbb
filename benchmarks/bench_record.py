"""Recording overhead through our recorders vs the bare env and vs each peer, same actions.

CartPole-v1 (Gymnasium), mpe2 simple_spread_v3 (PettingZoo parallel, 3 agents) and
connect_four_v3 (PettingZoo AEC, 2 agents, action masks). The peers record the way their users
do: step the bare env, then call their buffer's ``add`` (flexibuff 0.3.1, SB3, Tianshou, TorchRL;
`peers.py`); they are single-agent buffers, so the multi-agent envs get one per agent, and in
connect four each agent's transition is added at its next turn. Prints the median of several
interleaved rounds, in microseconds per env step (per turn for AEC), and the ratios to the bare loop.
Run: python benchmarks/bench_record.py [--env cartpole|simple_spread|connect_four|all] [--steps N]
     (peers: pip install -e '.[bench]')
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import PEERS, SB3_TARGET, Add, installed

STATE = "flexibuff_envs, with global state"
UNHELD = "flexibuff_envs, Ctrl-C not held"  # what holding Ctrl-C across each step's bookkeeping costs
SKIP = ("SB3 optimize_memory_usage", "Tianshou ignore_obs_next")  # same add path as their defaults


def run(env: gym.Env, actions: np.ndarray) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return (time.perf_counter() - start) / len(actions) * 1e6


class _NoHold:
    """A no-op in place of `flexibuff_envs.interrupts.HOLD`, to measure what the hold costs."""

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


def run_unheld(env: gym.Env, actions: np.ndarray) -> float:
    """`run` with Ctrl-C not held across the recorder's bookkeeping."""
    from flexibuff_envs import interrupts
    from flexibuff_envs.wrappers import core

    held = interrupts.HOLD, core.HOLD
    interrupts.HOLD = core.HOLD = _NoHold()  # type: ignore[assignment]
    try:
        return run(env, actions)
    finally:
        interrupts.HOLD, core.HOLD = held


def run_peer(env: gym.Env, add: Add, actions: np.ndarray) -> float:
    obs, _ = env.reset(seed=0)
    start = time.perf_counter()
    for action in actions:
        obs_, reward, terminated, truncated, _ = env.step(action)
        add(obs, action, float(reward), obs_, terminated, truncated)
        obs = env.reset()[0] if terminated or truncated else obs_
    return (time.perf_counter() - start) / len(actions) * 1e6


def run_parallel(env: Any, actions: list[dict[str, int]], adds: dict[str, Add] | None = None) -> float:
    """A parallel env's loop; with ``adds``, each agent's transition goes to its own peer buffer."""
    obs, _ = env.reset(seed=0)
    start = time.perf_counter()
    for step in actions:
        obs_, rewards, terminations, truncations, _ = env.step(step)
        if adds is not None:
            for agent, action in step.items():
                adds[agent](
                    obs[agent], action, float(rewards[agent]), obs_[agent], terminations[agent], truncations[agent]
                )
        obs = obs_
        if not env.agents:
            obs, _ = env.reset()
    return (time.perf_counter() - start) / len(actions) * 1e6


def run_aec(env: Any, draws: np.ndarray, adds: dict[str, Add] | None = None) -> float:
    """An AEC env's loop, a random legal move per turn (from ``draws``). With ``adds``, an agent's
    transition is complete at its next turn, as peer users must arrange by hand."""
    env.reset(seed=0)
    pending: dict[str, tuple[np.ndarray, int]] = {}
    start = time.perf_counter()
    for u in draws:
        agent = env.agent_selection
        obs, reward, terminated, truncated, _ = env.last()
        if adds is not None and agent in pending:
            before, action = pending.pop(agent)
            adds[agent](before, action, float(reward), obs["observation"], terminated, truncated)
        if terminated or truncated:
            env.step(None)
            if not env.agents:
                env.reset()
            continue
        legal = np.flatnonzero(obs["action_mask"])
        action = int(legal[int(u * len(legal))])
        if adds is not None:
            pending[agent] = (obs["observation"], action)
        env.step(action)
    return (time.perf_counter() - start) / len(draws) * 1e6


def report(title: str, timings: dict[str, list[float]], target: str = "") -> None:
    us = {name: statistics.median(t) for name, t in timings.items()}
    print(title)
    for name, value in us.items():
        ratio = "" if name == "bare" else f"  {value / us['bare']:5.2f}x"
        label = {"bare": "bare env step", "recorded": "flexibuff_envs (fe.record)", STATE: STATE, UNHELD: UNHELD}.get(
            name, name + " (step + add)"
        )
        print(f"  {label:<38} {value:8.2f} us{ratio}{target if name == 'recorded' else ''}")


def cartpole(steps: int, rounds: int) -> None:
    actions = np.random.default_rng(0).integers(0, 2, steps).tolist()
    bare = gym.make("CartPole-v1")
    recorded = fe.record(gym.make("CartPole-v1"), num_steps=steps)
    peers = {
        name: make(bare.observation_space, steps)[0]
        for name, make in PEERS.items()
        if installed(name) and name not in SKIP
    }
    timings: dict[str, list[float]] = {"bare": [], "recorded": [], UNHELD: [], **{name: [] for name in peers}}
    for _ in range(rounds):  # interleaved, so drift on a shared machine hits all alike
        timings["bare"].append(run(bare, actions))
        timings["recorded"].append(run(recorded, actions))
        timings[UNHELD].append(run_unheld(recorded, actions))
        for name, add in peers.items():
            timings[name].append(run_peer(bare, add, actions))
    report(
        f"CartPole-v1, {steps} steps x {rounds} rounds (median us/step; ratio to the bare loop)",
        timings,
        "  (first target <= 1.30x)",
    )
    sb3 = "SB3 ReplayBuffer"
    if sb3 in timings:
        ratio = statistics.median(timings["recorded"]) / statistics.median(timings[sb3])
        print(f"  recorded / {sb3} (step + add): {ratio:.2f}x (target <= {SB3_TARGET:.2f}x)")


def per_agent(env: Any, steps: int) -> dict[str, dict[str, Add]]:
    """Each installed peer: one buffer per agent, as single-agent buffers are used for many agents."""
    return {
        name: {agent: make(env.observation_space(agent), steps)[0] for agent in env.possible_agents}
        for name, make in PEERS.items()
        if installed(name) and name not in SKIP
    }


def simple_spread(steps: int, rounds: int) -> None:
    from mpe2 import simple_spread_v3

    def make() -> Any:
        return simple_spread_v3.parallel_env(max_cycles=25)

    bare = make()
    rng = np.random.default_rng(0)
    actions = [
        {agent: int(a) for agent, a in zip(bare.possible_agents, row)}
        for row in rng.integers(0, 5, (steps, len(bare.possible_agents)))
    ]
    recorded = fe.record(make(), num_steps=steps, record_state=False)  # the peers keep no global state
    with_state = fe.record(make(), num_steps=steps)
    peers = per_agent(bare, steps)
    timings: dict[str, list[float]] = {"bare": [], "recorded": [], STATE: [], **{name: [] for name in peers}}
    for _ in range(rounds):
        timings["bare"].append(run_parallel(bare, actions))
        timings["recorded"].append(run_parallel(recorded, actions))
        timings[STATE].append(run_parallel(with_state, actions))
        for name, adds in peers.items():
            timings[name].append(run_parallel(bare, actions, adds))
    report(f"mpe2 simple_spread_v3 (parallel, 3 agents), {steps} steps x {rounds} rounds", timings)


def connect_four(steps: int, rounds: int) -> None:
    from pettingzoo.classic import connect_four_v3

    draws = np.random.default_rng(0).random(steps)
    bare = connect_four_v3.env()
    recorded = fe.record(connect_four_v3.env(), num_steps=steps)
    bare.reset(seed=0)
    peers = {
        name: {agent: make(bare.observation_space(agent)["observation"], steps)[0] for agent in bare.possible_agents}
        for name, make in PEERS.items()
        if installed(name) and name not in SKIP
    }
    timings: dict[str, list[float]] = {"bare": [], "recorded": [], **{name: [] for name in peers}}
    for _ in range(rounds):
        timings["bare"].append(run_aec(bare, draws))
        timings["recorded"].append(run_aec(recorded, draws))
        for name, adds in peers.items():
            timings[name].append(run_aec(bare, draws, adds))
    report(f"PettingZoo connect_four_v3 (AEC, 2 agents, masks), {steps} turns x {rounds} rounds", timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50_000, help="CartPole steps (a fifth for the others)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--env", choices=["cartpole", "simple_spread", "connect_four", "all"], default="all")
    args = parser.parse_args()
    if args.env in ("cartpole", "all"):
        cartpole(args.steps, args.rounds)
    if args.env in ("simple_spread", "all"):
        simple_spread(args.steps // 5, args.rounds)
    if args.env in ("connect_four", "all"):
        connect_four(args.steps // 5, args.rounds)


if __name__ == "__main__":
    main()
