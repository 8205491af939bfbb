"""SB3's DQN on CartPole-v1 with RL Zoo's settings, trained once with SB3's own ReplayBuffer and
once with ours (``flexibuff_envs.integrations.sb3.ReplayBuffer``), from the same seed; prints
each one's evaluation return after the same number of steps.

Run: python examples/sb3_dqn_buffers.py [--seed 0] [--steps 12000]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

from flexibuff_envs.integrations.sb3 import ReplayBuffer


def rl_zoo_dqn(buffer_class: type, seed: int) -> DQN:
    """SB3's DQN on CartPole-v1 with RL Zoo's settings, storing its steps in ``buffer_class``."""
    return DQN(
        "MlpPolicy",
        gym.make("CartPole-v1"),
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        replay_buffer_class=buffer_class,
        seed=seed,
        device="cpu",
    )


def trained_return(buffer_class: type, seed: int, steps: int) -> float:
    """Mean return over 10 evaluation episodes of `rl_zoo_dqn` trained ``steps`` steps."""
    model = rl_zoo_dqn(buffer_class, seed)
    model.learn(total_timesteps=steps)
    mean, _ = evaluate_policy(model, Monitor(gym.make("CartPole-v1")), n_eval_episodes=10)
    return float(mean)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=12_000)
    args = parser.parse_args(argv)
    theirs = trained_return(SB3ReplayBuffer, args.seed, args.steps)
    ours = trained_return(ReplayBuffer, args.seed, args.steps)
    print(
        f"seed {args.seed}, {args.steps} steps: SB3's buffer {theirs:.1f}, ours {ours:.1f} (mean return, 10 episodes)"
    )


if __name__ == "__main__":
    main()
