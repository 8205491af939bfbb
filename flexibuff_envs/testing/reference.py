"""An independent reference: a plain loop over a bare Gymnasium env, logging what should be recorded.

It spells out SPEC section 2 by hand (gymnasium's own ``flatten``, plain lists) and shares no code
with the recorders, so the two can be compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from flexibuff_envs.errors import ArgumentTypeError

COMPACT = (np.dtype(bool), np.dtype(np.uint8), np.dtype(np.int8))


def flat_obs(space: spaces.Space, value: Any) -> np.ndarray:
    """SPEC section 2 by hand: Box keeps compact dtypes, everything else is flatten() as float32."""
    if isinstance(space, spaces.Dict) and set(space.spaces) == {"observation", "action_mask"}:
        return flat_obs(space["observation"], value["observation"])
    if isinstance(space, spaces.Box):
        dtype = space.dtype if space.dtype in COMPACT else np.float32
        return np.asarray(value).reshape(-1).astype(dtype)
    return np.asarray(spaces.flatten(space, value), dtype=np.float32)


def split_action(space: spaces.Space, action: Any) -> tuple[list[int], list[float]]:
    """SPEC section 2 by hand: (discrete heads as 0-based indices, continuous values)."""
    if isinstance(space, spaces.Discrete):
        return [int(action) - int(space.start)], []
    if isinstance(space, spaces.MultiDiscrete):
        return list((np.asarray(action) - space.start).reshape(-1)), []
    if isinstance(space, spaces.MultiBinary):
        return list(np.asarray(action).reshape(-1)), []
    if isinstance(space, spaces.Box):
        return [], list(np.asarray(action, dtype=np.float32).reshape(-1))
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        raise ArgumentTypeError(f"the reference does not split actions of {space}")
    subs = list(space.spaces.items()) if isinstance(space, spaces.Dict) else list(enumerate(space.spaces))
    heads: list[int] = []
    conts: list[float] = []
    for key, sub in subs:
        d, c = split_action(sub, action[key])
        heads += d
        conts += c
    return heads, conts


def mask_of(obs: Any, info: dict[str, Any]) -> np.ndarray | None:
    if isinstance(obs, dict) and "action_mask" in obs:
        return np.asarray(obs["action_mask"], dtype=bool)
    return None if "action_mask" not in info else np.asarray(info["action_mask"], dtype=bool)


def plain_returns(rewards: list[float], gamma: float, bootstrap: float = 0.0) -> list[float]:
    out, acc = [0.0] * len(rewards), bootstrap
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + (gamma * acc if gamma else 0.0)  # with gamma 0 the return is the reward
        out[t] = acc
    return out


@dataclass
class Log:
    """Per step, in time order, what the recorder should hold."""

    obs: list[np.ndarray] = field(default_factory=list)
    obs_: list[np.ndarray] = field(default_factory=list)
    discrete: list[list[int]] = field(default_factory=list)
    continuous: list[list[float]] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    mask: list[np.ndarray | None] = field(default_factory=list)
    mask_: list[np.ndarray | None] = field(default_factory=list)
    episodes: list[tuple[int, int]] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    returned: list[tuple[Any, ...]] = field(default_factory=list)

    def G(self, gamma: float) -> np.ndarray:
        out = np.full(len(self.reward), np.nan)
        for start, end in self.episodes:
            out[start:end] = plain_returns(self.reward[start:end], gamma)
        return out


def play(
    env: gym.Env,
    *,
    seed: int,
    steps: int,
    actions: list[Any] | None = None,
    policy: Callable[[gym.Env, Any, dict], Any] | None = None,
) -> Log:
    """Run ``steps`` steps (resetting after each episode); ``actions`` replays a list."""
    log = Log()
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    log.returned.append((obs, info))
    start = 0
    for t in range(steps):
        if actions is not None:
            action = actions[t]
        elif policy is not None:
            action = policy(env, obs, info)
        else:
            mask = mask_of(obs, info)
            action = env.action_space.sample(None if mask is None else mask.astype(np.int8))
        nxt, reward, terminated, truncated, info_ = env.step(action)
        log.returned.append((nxt, reward, terminated, truncated, info_))
        log.actions.append(action)
        log.obs.append(flat_obs(env.observation_space, obs))
        log.obs_.append(flat_obs(env.observation_space, nxt))
        d, c = split_action(env.action_space, action)
        log.discrete.append(d)
        log.continuous.append(c)
        log.reward.append(float(reward))
        log.terminated.append(bool(terminated))
        log.truncated.append(bool(truncated))
        log.mask.append(mask_of(obs, info))
        log.mask_.append(mask_of(nxt, info_))
        obs, info = nxt, info_
        if terminated or truncated:
            log.episodes.append((start, t + 1))
            start = t + 1
            obs, info = env.reset()
            log.returned.append((obs, info))
    return log
