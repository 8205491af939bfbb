"""PettingZoo into SB3 the way PettingZoo's tutorials teach (SuperSuit), recorded agent by agent.

simple_spread_v3 is turned into an SB3 vector env by SuperSuit (each agent of each copy is a
sub-env); `RecordingVecEnv` records that vector env, so every agent's steps land whole in a lane of
its own while SB3's PPO trains on them.

Run: python examples/supersuit_spread_sb3.py [--timesteps 20000]
     (pip install 'flexibuff_envs[sb3,pettingzoo]' supersuit)
"""

from __future__ import annotations

import argparse
import time

import supersuit as ss
from mpe2 import simple_spread_v3
from stable_baselines3 import PPO

from flexibuff_envs.integrations.sb3 import RecordingVecEnv


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=20_000, help="SB3 steps over all agents and copies")
    parser.add_argument("--copies", type=int, default=2, help="copies of the env SuperSuit steps together")
    args = parser.parse_args(argv)
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)
    vec = ss.concat_vec_envs_v1(
        ss.pettingzoo_env_to_vec_env_v1(env), args.copies, num_cpus=0, base_class="stable_baselines3"
    )
    venv = RecordingVecEnv(vec, num_steps=args.timesteps // vec.num_envs + 256)
    model = PPO("MlpPolicy", venv, n_steps=min(256, args.timesteps // vec.num_envs), device="cpu")
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps)
    stats = venv.buffer.episode_stats()
    print(
        f"{model.num_timesteps} SB3 steps ({venv.num_envs} agent lanes) in {time.perf_counter() - start:.0f} s; "
        f"{len(venv.buffer)} recorded in {venv.buffer.n_episodes} whole agent-episodes of "
        f"{sorted(set(stats['lengths'].tolist()))} steps, mean return {stats['returns'].mean():.1f}"
    )


if __name__ == "__main__":
    main()
