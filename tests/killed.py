"""A recording that runs until it is killed, and the plain loops its logged episodes must equal.

``python -m tests.killed KIND DIR`` records KIND to the episode log DIR, replaying fixed seeds and
actions in a cycle, and prints ``ended N`` (flushed) whenever the env has reported N ended
episodes in all: counted from what the env returns, after the call returns, never from the log.
``python -m tests.killed KIND DIR EPISODES`` stops once EPISODES more have ended, closes the
recorder and exits 0 (a resumed recording). `kill_after` and `recording` start them from another
process (the kill test and ``benchmarks/bench_kills.py``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

KINDS = ("gym", "vector", "parallel", "aec", "atari", "atari vector")
#: rows of the recording's ring (a lane's, for a vector env): far fewer than its log holds
RING = {"gym": 600, "vector": 100, "parallel": 64, "aec": 64, "atari": 64, "atari vector": 100}


def _single(kind: str) -> gym.Env:
    if kind == "atari":
        return _pong(25)
    return gym.make("CartPole-v1")


def _vector(kind: str) -> gym.vector.VectorEnv:
    if kind == "atari vector":  # stacks of 4 grayscale frames (134 KB, kept a frame a row), episodes of 20-35 steps
        return gym.vector.SyncVectorEnv([lambda n=n: _pong(n, stacked=True) for n in (20, 25, 30, 35)])
    return gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")


def _pong(steps: int, *, stacked: bool = False) -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    if stacked:
        frames = gym.make("ALE/Pong-v5", obs_type="grayscale", max_episode_steps=steps)
        return gym.wrappers.FrameStackObservation(frames, 4)
    return gym.make("ALE/Pong-v5", max_episode_steps=steps)


def _parallel() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(max_cycles=10)


def _aec() -> Any:
    from pettingzoo.classic import connect_four_v3

    return connect_four_v3.env()


def _actions(kind: str) -> Any:
    """The actions one cycle replays."""
    rng = np.random.default_rng(0)
    if kind == "gym":
        from flexibuff_envs.testing.reference import play

        log = play(_single(kind), seed=0, steps=3000)
        return log.actions[: log.episodes[-1][1]]  # whole episodes only
    if kind == "atari":
        return rng.integers(0, 6, 75).tolist()  # three episodes of 25 steps
    if kind == "vector":
        return rng.integers(0, 2, (150, 8))
    if kind == "atari vector":
        return rng.integers(0, 6, (105, 4))
    if kind == "parallel":
        return rng.integers(0, 5, (4, 10, 3))  # 4 episodes of 10 steps, 3 agents
    from flexibuff_envs.testing.pz_reference import play_aec

    return play_aec(_aec(), seed=0, episodes=10).actions


def ends(kind: str, env: Any, actions: Any) -> Iterator[int]:
    """Play cycle after cycle of ``kind`` on the recorded ``env``; yield, after each call that
    ends episodes, how many it ended."""
    running = np.zeros(getattr(env, "num_envs", 1), dtype=bool)  # vector: sub-envs whose episode has a transition
    while True:
        if kind in ("gym", "atari"):
            env.reset(seed=0)
            for action in actions:
                _, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    yield 1
                    env.reset()
        elif kind.endswith("vector"):
            env.reset(seed=0)
            if running.any():  # the reset ended these, as truncated
                yield int(running.sum())
            running[:] = False
            reset_next = np.zeros(
                len(running), dtype=bool
            )  # gymnasium's next-step autoreset: that step is no transition
            for action in actions:
                _, _, terminated, truncated, _ = env.step(action)
                done = terminated | truncated
                running = (running | ~reset_next) & ~done
                reset_next = done
                if done.any():
                    yield int(done.sum())
        elif kind == "parallel":
            for e, episode in enumerate(actions):
                env.reset(seed=e)
                for step in episode:
                    env.step({agent: int(step[i]) for i, agent in enumerate(env.possible_agents)})
                yield 1  # max_cycles: every agent is truncated at its 10th step
        else:
            taken = iter(actions)
            for e in range(10):
                env.reset(seed=e)
                for _ in env.agent_iter():
                    env.last()
                    env.step(next(taken))
                yield 1


def reference(kind: str) -> dict[bytes, np.ndarray]:
    """Each episode of one cycle of a plain loop over the bare env, as the buffer shows it:
    its observations' bytes -> its per-agent rewards. A vector env's episodes cut by the
    cycle's last reset are among them (the recorder ends those as truncated)."""
    actions = _actions(kind)
    episodes: dict[bytes, np.ndarray] = {}
    if kind in ("gym", "atari"):
        from flexibuff_envs.testing.reference import play

        log = play(_single(kind), seed=0, steps=len(actions), actions=actions)
        for a, b in log.episodes:
            episodes[np.array(log.obs[a:b]).tobytes()] = np.array(log.reward[a:b], dtype=np.float32)
    elif kind.endswith("vector"):
        env = _vector(kind)
        obs, _ = env.reset(seed=0)
        rows: list[list[tuple[np.ndarray, float]]] = [[] for _ in range(env.num_envs)]
        reset_next = np.zeros(env.num_envs, dtype=bool)  # gymnasium's next-step autoreset: that step is no transition
        for action in actions:
            nxt, reward, terminated, truncated, _ = env.step(action)
            for i in np.flatnonzero(~reset_next):
                rows[i].append((np.array(obs[i]), float(reward[i])))
                if terminated[i] or truncated[i]:
                    _keep(episodes, rows[i])
                    rows[i] = []
            reset_next = terminated | truncated
            obs = nxt
        for lane in rows:  # cut by the next cycle's reset
            if lane:
                _keep(episodes, lane)
    elif kind == "parallel":
        env = _parallel()
        for e, episode in enumerate(actions):
            obs, _ = env.reset(seed=e)
            seen, rewards = [], []
            for step in episode:
                seen.append([obs[agent] for agent in env.possible_agents])
                obs, reward, *_ = env.step({agent: int(step[i]) for i, agent in enumerate(env.possible_agents)})
                rewards.append([reward[agent] for agent in env.possible_agents])
            episodes[np.array(seen, dtype=np.float32).swapaxes(0, 1).tobytes()] = np.array(rewards, dtype=np.float32).T
    else:
        from flexibuff_envs.testing.pz_reference import play_aec

        expected = play_aec(_aec(), seed=0, episodes=10)
        for a, b in expected.episodes:
            episodes[expected.obs[:, a:b].tobytes()] = expected.rewards[:, a:b]
    return episodes


def _keep(episodes: dict[bytes, np.ndarray], rows: list[tuple[np.ndarray, float]]) -> None:
    episodes[np.array([o for o, _ in rows]).tobytes()] = np.array([r for _, r in rows], dtype=np.float32)


def recorded(kind: str, directory: str) -> Any:
    """``kind``'s env recorded to the log ``directory`` (continued if there is one)."""
    make = {
        "gym": lambda: _single(kind),
        "atari": lambda: _single(kind),
        "vector": lambda: _vector(kind),
        "atari vector": lambda: _vector(kind),
        "parallel": _parallel,
        "aec": _aec,
    }[kind]
    return fe.record(make(), num_steps=RING[kind], log=directory)


def recording(kind: str, directory: Path, *args: str) -> subprocess.Popen[str]:
    """``python -m tests.killed KIND DIRECTORY ARGS...`` started, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.killed", kind, str(directory), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


def kill_after(kind: str, directory: Path, seconds: float) -> int:
    """Record ``kind`` to the log ``directory``, SIGKILL the recording ``seconds`` after it
    started, and return how many episodes it had reported ended by then."""
    child = recording(kind, directory)
    if child.stdout is None or child.stdout.readline() != "recording\n":
        raise RuntimeError(f"the {kind} recording did not start")
    lines: list[str] = []
    reader = threading.Thread(target=lines.extend, args=(child.stdout,))
    reader.start()
    time.sleep(seconds)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    reader.join()
    child.stdout.close()
    return int(lines[-1].split()[1]) if lines else 0


def main(kind: str, directory: str, episodes: int | None = None) -> None:
    actions = _actions(kind)
    env = recorded(kind, directory)
    print("recording", flush=True)
    ended = 0
    for count in ends(kind, env, actions):
        ended += count
        print(f"ended {ended}", flush=True)
        if episodes is not None and ended >= episodes:
            env.close()
            return


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
