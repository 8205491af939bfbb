"""Recording overhead through our recorders vs the bare env and vs each peer, same actions.

CartPole-v1 (Gymnasium), mpe2 simple_spread_v3 (PettingZoo parallel, 3 agents) and
connect_four_v3 (PettingZoo AEC, 2 agents, action masks). The peers record the way their users
do: step the bare env, then call their buffer's ``add`` (flexibuff 0.3.1, SB3, Tianshou, TorchRL;
`peers.py`); they are single-agent buffers, so the multi-agent envs get one per agent, and in
connect four each agent's transition is added at its next turn. On CartPole, two loops also
draw 256 transitions (as torch tensors) after every step, as an off-policy loop that trains
every step does: ``fe.record`` and SB3's ``ReplayBuffer``.

In each round every loop of a case runs at once, each on its own env, taking turns a chunk of
steps at a time (the order reverses every turn): a host whose speed drifts, as a shared one does
by tens of percent within seconds, slows them all alike. Prints the median over the rounds in
microseconds per env step (per turn for AEC), and the median of the rounds' ratios to the bare loop.
Run: python benchmarks/bench_record.py [--env cartpole|simple_spread|connect_four|all] [--steps N]
     (peers: pip install -e '.[bench]')
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import PEERS, SB3_TARGET, Add, Sample, installed

STATE = "flexibuff_envs, with global state"
SAMPLED = "flexibuff_envs, sample(256) each step"
SB3_SAMPLED = "SB3 ReplayBuffer, sample(256) each step"
#: a sampled loop's batch, and the steps it records before its first
BATCH, WARM = 256, 64
UNHELD = "flexibuff_envs, Ctrl-C not held"  # what holding Ctrl-C across each step's bookkeeping costs
SKIP = ("SB3 optimize_memory_usage", "Tianshou ignore_obs_next")  # same add path as their defaults
#: steps a loop runs before the next one's turn
CHUNK = 500

#: a loop over an env: ``CHUNK`` steps per ``next``
Loop = Generator[None, None, None]


def chunks(n: int) -> list[range]:
    return [range(lo, min(lo + CHUNK, n)) for lo in range(0, n, CHUNK)]


def single(env: gym.Env, actions: list[int], add: Add | None = None, sample: Sample | None = None) -> Loop:
    """A Gymnasium env's loop; with ``add``, each transition goes to a peer buffer; with
    ``sample``, a batch of `BATCH` is drawn after every step once `WARM` are in (as an
    off-policy loop that trains every step does)."""
    obs, _ = env.reset(seed=0)
    for chunk in chunks(len(actions)):
        for j in chunk:
            action = actions[j]
            obs_, reward, terminated, truncated, _ = env.step(action)
            if add is not None:
                add(obs, action, float(reward), obs_, terminated, truncated)
            obs = env.reset()[0] if terminated or truncated else obs_
            if sample is not None and j >= WARM:
                sample(BATCH)
        yield


class _NoHold:
    """A no-op in place of `flexibuff_envs.interrupts.HOLD`, to measure what the hold costs."""

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


def unheld(loop: Loop) -> Loop:
    """``loop`` with Ctrl-C not held across the recorder's bookkeeping (in its turns only): every
    module of the package that holds it by name gets a no-op instead."""
    from flexibuff_envs import interrupts

    holding = [m for name, m in sys.modules.items() if name.startswith("flexibuff_envs") and hasattr(m, "HOLD")]
    real, none = interrupts.HOLD, _NoHold()
    while True:
        for module in holding:
            module.HOLD = none
        try:
            next(loop)
        except StopIteration:
            return
        finally:
            for module in holding:
                module.HOLD = real
        yield


def parallel(env: Any, actions: list[dict[str, int]], adds: dict[str, Add] | None = None) -> Loop:
    """A parallel env's loop; with ``adds``, each agent's transition goes to its own peer buffer."""
    obs, _ = env.reset(seed=0)
    for chunk in chunks(len(actions)):
        for j in chunk:
            step = actions[j]
            obs_, rewards, terminations, truncations, _ = env.step(step)
            if adds is not None:
                for agent, action in step.items():
                    adds[agent](
                        obs[agent], action, float(rewards[agent]), obs_[agent], terminations[agent], truncations[agent]
                    )
            obs = obs_
            if not env.agents:
                obs, _ = env.reset()
        yield


def aec(env: Any, draws: list[float], adds: dict[str, Add] | None = None) -> Loop:
    """An AEC env's loop, a random legal move per turn (from ``draws``). With ``adds``, an agent's
    transition is complete at its next turn, as peer users must arrange by hand."""
    env.reset(seed=0)
    pending: dict[str, tuple[np.ndarray, int]] = {}
    for chunk in chunks(len(draws)):
        for j in chunk:
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
            action = int(legal[int(draws[j] * len(legal))])
            if adds is not None:
                pending[agent] = (obs["observation"], action)
            env.step(action)
        yield


def turns(loops: dict[str, Loop], steps: int) -> dict[str, float]:
    """Run ``loops`` to their ends, taking turns; microseconds per step each."""
    spent = dict.fromkeys(loops, 0.0)
    live = list(loops)
    for turn in range(len(chunks(steps)) + 1):
        for name in list(live if turn % 2 == 0 else reversed(live)):
            start = time.perf_counter()
            try:
                next(loops[name])
            except StopIteration:
                live.remove(name)
                continue
            spent[name] += time.perf_counter() - start
    return {name: total / steps * 1e6 for name, total in spent.items()}


def measure(make_loops: Callable[[], dict[str, Loop]], steps: int, rounds: int) -> dict[str, list[float]]:
    """Each loop's microseconds per step in each round (fresh envs and buffers every round)."""
    timings: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, us in turns(make_loops(), steps).items():
            timings.setdefault(name, []).append(us)
    return timings


def report(title: str, timings: dict[str, list[float]], target: str = "") -> None:
    us = {name: statistics.median(t) for name, t in timings.items()}
    print(title)
    for name, value in us.items():
        ratio = statistics.median(a / b for a, b in zip(timings[name], timings["bare"]))
        shown = "" if name == "bare" else f"  {ratio:5.2f}x"
        label = {"bare": "bare env step", "recorded": "flexibuff_envs (fe.record)"}.get(
            name, name if name in (STATE, UNHELD, SAMPLED, SB3_SAMPLED) else name + " (step + add)"
        )
        print(f"  {label:<38} {value:8.2f} us{shown}{target if name == 'recorded' else ''}")


def peers_of(spaces: Callable[[], Any], steps: int) -> dict[str, Any]:
    """Each installed peer's buffer(s): ``spaces()`` is one space or one per agent."""
    made: dict[str, Any] = {}
    for name, make in PEERS.items():
        if installed(name) and name not in SKIP:
            space = spaces()
            made[name] = (
                {agent: make(s, steps)[0] for agent, s in space.items()}
                if isinstance(space, dict)
                else make(space, steps)[0]
            )
    return made


def cartpole(steps: int, rounds: int) -> None:
    actions = np.random.default_rng(0).integers(0, 2, steps).tolist()

    def loops() -> dict[str, Loop]:
        space = gym.make("CartPole-v1").observation_space
        sampled = fe.record(gym.make("CartPole-v1"), num_steps=steps)
        made = {
            "bare": single(gym.make("CartPole-v1"), actions),
            "recorded": single(fe.record(gym.make("CartPole-v1"), num_steps=steps), actions),
            UNHELD: unheld(single(fe.record(gym.make("CartPole-v1"), num_steps=steps), actions)),
            SAMPLED: single(sampled, actions, sample=lambda n: sampled.buffer.sample_transitions(n, as_torch=True)),
            **{
                name: single(gym.make("CartPole-v1"), actions, add)
                for name, add in peers_of(lambda: space, steps).items()
            },
        }
        if installed("SB3 ReplayBuffer"):
            add, sample = PEERS["SB3 ReplayBuffer"](space, steps)
            made[SB3_SAMPLED] = single(gym.make("CartPole-v1"), actions, add, sample)
        return made

    timings = measure(loops, steps, rounds)
    report(
        f"CartPole-v1, {steps} steps x {rounds} rounds, taking turns every {CHUNK} steps "
        "(median us/step; ratio to the bare loop)",
        timings,
        "  (first target <= 1.30x)",
    )
    sb3 = "SB3 ReplayBuffer"
    if sb3 in timings:
        ratio = statistics.median(a / b for a, b in zip(timings["recorded"], timings[sb3]))
        print(f"  recorded / {sb3} (step + add): {ratio:.2f}x (target <= {SB3_TARGET:.2f}x)")
        ratio = statistics.median(a / b for a, b in zip(timings[SAMPLED], timings[SB3_SAMPLED]))
        print(f"  sampling each step, recorded / {sb3}: {ratio:.2f}x")


def simple_spread(steps: int, rounds: int) -> None:
    from mpe2 import simple_spread_v3

    def make() -> Any:
        return simple_spread_v3.parallel_env(max_cycles=25)

    agents = make().possible_agents
    rng = np.random.default_rng(0)
    actions = [{agent: int(a) for agent, a in zip(agents, row)} for row in rng.integers(0, 5, (steps, len(agents)))]

    def loops() -> dict[str, Loop]:
        env = make()
        return {
            "bare": parallel(make(), actions),
            # the peers keep no global state
            "recorded": parallel(fe.record(make(), num_steps=steps, record_state=False), actions),
            STATE: parallel(fe.record(make(), num_steps=steps), actions),
            **{
                name: parallel(make(), actions, adds)
                for name, adds in peers_of(lambda: {a: env.observation_space(a) for a in agents}, steps).items()
            },
        }

    report(
        f"mpe2 simple_spread_v3 (parallel, 3 agents), {steps} steps x {rounds} rounds", measure(loops, steps, rounds)
    )


def connect_four(steps: int, rounds: int) -> None:
    from pettingzoo.classic import connect_four_v3

    draws = np.random.default_rng(0).random(steps).tolist()

    def loops() -> dict[str, Loop]:
        env = connect_four_v3.env()
        spaces = {agent: env.observation_space(agent)["observation"] for agent in env.possible_agents}
        return {
            "bare": aec(connect_four_v3.env(), draws),
            "recorded": aec(fe.record(connect_four_v3.env(), num_steps=steps), draws),
            **{name: aec(connect_four_v3.env(), draws, adds) for name, adds in peers_of(lambda: spaces, steps).items()},
        }

    report(
        f"PettingZoo connect_four_v3 (AEC, 2 agents, masks), {steps} turns x {rounds} rounds",
        measure(loops, steps, rounds),
    )


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
