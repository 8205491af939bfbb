"""SB3's PPO trains on 4 CartPoles through `RecordingVecEnv`, which records every step of them;
then the recorded episodes are read back: their returns as SB3's Monitors counted them, and
`G` ready for any algorithm of one's own.

Run: python examples/sb3_ppo_cartpole.py [--timesteps 50000]   (pip install 'flexibuff_envs[sb3]')
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from flexibuff_envs.integrations.sb3 import RecordingVecEnv


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=50_000, help="SB3 steps over all sub-envs")
    parser.add_argument("--envs", type=int, default=4, help="sub-envs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    n_steps = min(2048, args.timesteps // args.envs)  # SB3 rolls out whole rollouts: it may go past timesteps
    venv = RecordingVecEnv(
        make_vec_env("CartPole-v1", n_envs=args.envs, seed=args.seed), num_steps=args.timesteps // args.envs + n_steps
    )  # every step kept
    model = PPO("MlpPolicy", venv, seed=args.seed, device="cpu", n_steps=n_steps)
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps)
    seconds = time.perf_counter() - start
    buffer = venv.buffer
    stats = buffer.episode_stats()
    returns = stats["returns"][:, 0]
    print(
        f"{model.num_timesteps} SB3 steps in {seconds:.0f} s, {len(buffer)} recorded in {buffer.n_episodes} "
        f"whole episodes; mean return of the first 20: {returns[:20].mean():.1f}, of the last 20: "
        f"{returns[-20:].mean():.1f}"
    )
    batch = buffer.sample_transitions(256, fields=("obs", "discrete_actions", "G"))
    print(
        f"a batch of 256 transitions: obs {batch.obs.shape}, G from {np.nanmin(batch.G):.1f} "
        f"to {np.nanmax(batch.G):.1f}"
    )


if __name__ == "__main__":
    main()
