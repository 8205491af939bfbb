"""``flexibuff-envs``: record an environment with a random legal policy and report what was kept."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

DEFAULT_ENV = "CartPole-v1"


def legal_random_action(env: gym.Env, obs: Any, info: dict[str, Any]) -> Any:
    """A uniformly random action, among the legal ones when the env gives a mask."""
    mask = info.get("action_mask")
    if mask is None and isinstance(obs, dict) and "action_mask" in obs:
        mask = obs["action_mask"]
    if mask is None:
        return env.action_space.sample()
    return env.action_space.sample(mask=np.asarray(mask, dtype=np.int8))


def record_episodes(env_id: str, *, episodes: int, seed: int, capacity: int) -> tuple[fe.GymRecorder, float]:
    """Record ``episodes`` episodes of ``env_id``; returns the recorder and the seconds it took."""
    env = fe.record(gym.make(env_id), num_steps=capacity)
    env.action_space.seed(seed)
    start = time.perf_counter()
    obs, info = env.reset(seed=seed)
    done = 0
    while done < episodes:
        obs, _, terminated, truncated, info = env.step(legal_random_action(env, obs, info))
        if terminated or truncated:
            done += 1
            obs, info = env.reset()
    env.close()
    return env, time.perf_counter() - start


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def cmd_record(args: argparse.Namespace) -> int:
    env, seconds = record_episodes(args.env, episodes=args.episodes, seed=args.seed, capacity=args.capacity)
    buffer = env.buffer
    stats = buffer.episode_stats()
    returns, lengths = stats["returns"][:, 0], stats["lengths"]
    steps = len(buffer)
    print(f"recorded {args.env}: {len(lengths)} episodes, {steps} steps "
          f"({steps / max(seconds, 1e-9):,.0f} steps/s)")
    print(f"  return       mean {returns.mean():.2f}  std {returns.std():.2f}  "
          f"min {returns.min():.2f}  max {returns.max():.2f}")
    print(f"  length       mean {lengths.mean():.1f}")
    spec = buffer.spec
    print(f"  layout       obs {spec.obs_size} x {spec.obs_dtype}, discrete heads "
          f"{list(spec.discrete_action_cardinalities)}, continuous {spec.continuous_action_dimension}, "
          f"masks {'yes' if spec.action_mask else 'no'}")
    print(f"  memory       {_megabytes(buffer.nbytes_per_row * steps)} for the recorded rows "
          f"({_megabytes(buffer.nbytes)} reserved for {buffer.num_steps} rows)")
    if args.out:
        path = buffer.save(args.out)
        print(f"  saved        {path} ({_megabytes(os.path.getsize(path))})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexibuff-envs", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record episodes with a random legal policy")
    rec.add_argument("env", nargs="?", default=DEFAULT_ENV, help=f"Gymnasium id (default {DEFAULT_ENV})")
    rec.add_argument("--episodes", type=int, default=10, help="episodes to record (default 10)")
    rec.add_argument("--out", help="save the buffer to this file")
    rec.add_argument("--seed", type=int, default=0, help="seed of the env and the policy")
    rec.add_argument("--capacity", type=int, default=100_000, help="buffer rows (default 100000)")
    rec.set_defaults(run=cmd_record)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "episodes", 1) < 1:
        print("flexibuff-envs: --episodes must be at least 1", file=sys.stderr)
        return 2
    try:
        return int(args.run(args))
    except gym.error.Error as exc:
        print(f"flexibuff-envs: {exc}", file=sys.stderr)
        return 2
    except fe.FlexibuffError as exc:
        print(f"flexibuff-envs: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
