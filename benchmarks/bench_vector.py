"""Recording a Gymnasium vector env vs the bare vector env, same actions, side by side.

gymnasium's natively vectorized CartPole (``vectorization_mode="vector_entry_point"``, one numpy
step for all sub-envs) with 64 sub-envs, and a SyncVectorEnv of 8 CartPole-v1. Each is recorded
into a ring that holds the whole run, and into one that wraps (its oldest episodes forgotten as
it goes), and recorded while a DQN-style loop samples 256 rows after every step once 32 vector steps are
in (the bare loop does not sample: that ratio prices the sampling too); and, when Stable-Baselines3 is installed,
the bare env with each step added to SB3's ``ReplayBuffer`` as its off-policy algorithms do. Prints
the median of interleaved rounds in microseconds per sub-env step, the ratios to the bare env, and
the recorded loop's ratio to the SB3 loop (its target: ``peers.SB3_TARGET``, README "Speed").
Run: python benchmarks/bench_vector.py [--rounds N]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import SB3_TARGET

SAMPLING = "recorded + sample(256) each step"
WARM = 32  # vector steps recorded before the sampling loop starts reading
SB3 = "SB3 ReplayBuffer.add each step"
CASES = {  # name: (make, vector steps per round, the first target: recorded / bare)
    "native CartPole x64 (vector_entry_point)": (
        lambda: gym.make_vec("CartPole-v1", 64, vectorization_mode="vector_entry_point"),
        2_000,
        1.30,
    ),
    "SyncVectorEnv CartPole x8": (lambda: gym.make_vec("CartPole-v1", 8, vectorization_mode="sync"), 4_000, 1.15),
}


class SB3Added(gym.vector.VectorWrapper):
    """The bare vector env, each step added to Stable-Baselines3's ``ReplayBuffer`` as its
    off-policy algorithms add it (``add(obs, next_obs, actions, rewards, dones, infos)``)."""

    def __init__(self, env: gym.vector.VectorEnv, size: int) -> None:
        from stable_baselines3.common.buffers import ReplayBuffer

        super().__init__(env)
        self.replay = ReplayBuffer(
            size, env.single_observation_space, env.single_action_space, device="cpu", n_envs=env.num_envs
        )
        self.infos: list[dict[str, Any]] = [{} for _ in range(env.num_envs)]

    def reset(self, **kwargs: Any) -> Any:
        self.obs, info = self.env.reset(**kwargs)
        return self.obs, info

    def step(self, actions: Any) -> Any:
        result = self.env.step(actions)
        obs, rewards, terminated, truncated, _ = result
        self.replay.add(self.obs, obs, actions, rewards, terminated | truncated, self.infos)
        self.obs = obs
        return result


def run(env: Any, actions: np.ndarray, sample: bool = False) -> float:
    env.reset(seed=0)
    if sample:  # a DQN-style loop starts learning after some steps (SB3's learning_starts), untimed
        for action in actions[:WARM]:
            env.step(action)
        actions = actions[WARM:]
    start = time.perf_counter()
    for action in actions:
        env.step(action)
        if sample:  # then reads the buffer after every step: each read writes the staged step
            env.buffer.sample_transitions(256)
    len(getattr(env, "buffer", ()))  # a recorder's last block is written when the buffer is read
    return (time.perf_counter() - start) / actions.size * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for name, (make, steps, target) in CASES.items():
        bare = make()
        actions = np.random.default_rng(0).integers(0, 2, (steps, bare.num_envs))
        recorders = {
            "recorded": fe.record(make(), num_steps=steps * args.rounds),
            "recorded, ring wrapping": fe.record(make(), num_steps=steps),
            SAMPLING: fe.record(make(), num_steps=steps * args.rounds),
        }
        if importlib.util.find_spec("stable_baselines3") is not None:  # the peer our users come from
            recorders[SB3] = SB3Added(make(), steps * bare.num_envs * args.rounds)
        timings: dict[str, list[float]] = {"bare": [], **{label: [] for label in recorders}}
        for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits all alike
            timings["bare"].append(run(bare, actions))
            for label, env in recorders.items():
                timings[label].append(
                    run(env, actions[: steps // 10] if label == SAMPLING else actions, sample=label == SAMPLING)
                )
        us = {label: statistics.median(t) for label, t in timings.items()}
        print(f"{name}, {steps} steps x {args.rounds} rounds (median us per sub-env step; ratio to bare)")
        for label, value in us.items():
            ratio = "" if label == "bare" else f"  {value / us['bare']:5.2f}x"
            goal = f"  (first target <= {target:.2f}x)" if label == "recorded" else ""
            print(f"  {label:<34} {value:7.3f} us{ratio}{goal}")
        if SB3 in us:
            print(f"  recorded / {SB3}: {us['recorded'] / us[SB3]:.2f}x (target <= {SB3_TARGET:.2f}x)")


if __name__ == "__main__":
    main()
